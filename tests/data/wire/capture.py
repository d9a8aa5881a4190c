"""Re-capture the real-stack wire samples in this folder (run by hand, not by the tests).

    python tests/data/wire/capture.py http://127.0.0.1:18431

Sends one small tool-offering request per protocol family to a running llama-server (--jinja),
streaming and not, and writes each response body exactly as received to `<name>.body` with its
status and content type in `index.json`. The tests decode these bytes; nothing is edited by hand.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).parent
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = "What is the weather in Paris? Use the tool."
SYSTEM = "You are a helpful assistant with tools."


def requests() -> dict[str, tuple[str, dict]]:
    chat = {
        "model": "m",
        "max_tokens": 60,
        "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
        "tools": [{"type": "function", "function": WEATHER}],
    }
    responses = {
        "model": "m",
        "max_output_tokens": 60,
        "temperature": 0,
        "instructions": SYSTEM,
        "input": [{"type": "message", "role": "user", "content": ASK}],
        "tools": [{"type": "function", **WEATHER}],
    }
    messages = {
        "model": "m",
        "max_tokens": 60,
        "temperature": 0,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": ASK}],
        "tools": [
            {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
        ],
    }
    completion = {"prompt": "def add(a, b):", "n_predict": 16, "temperature": 0}
    out = {}
    for name, path, body in (
        ("chat", "/v1/chat/completions", chat),
        ("responses", "/v1/responses", responses),
        ("messages", "/v1/messages", messages),
        ("completion", "/completion", completion),
        (
            "v1completions",
            "/v1/completions",
            {"model": "m", "prompt": "def add(a, b):", "max_tokens": 16, "temperature": 0},
        ),
    ):
        for stream in (False, True):
            extra = {"stream": stream}
            if stream and name == "chat":
                extra["stream_options"] = {"include_usage": True}
            out[f"{name}_{'stream' if stream else 'json'}"] = (path, {**body, **extra})
    return out


def capture(base: str, wanted: dict[str, tuple[str, dict]], folder: Path) -> None:
    """Send each request to `base` and write its response body, status and content type to `folder`."""
    index = {}
    for name, (path, body) in wanted.items():
        req = urllib.request.Request(
            base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                status, ctype, data = resp.status, resp.headers.get("Content-Type"), resp.read()
        except urllib.error.HTTPError as exc:
            status, ctype, data = exc.code, exc.headers.get("Content-Type"), exc.read()
        (folder / f"{name}.body").write_bytes(data)
        index[name] = {"path": path, "request": body, "status": status, "content_type": ctype}
        print(name, status, len(data), file=sys.stderr)
    (folder / "index.json").write_text(json.dumps(index, indent=1) + "\n")


def main(base: str) -> None:
    capture(base, requests(), HERE)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18431")
