"""Re-capture the real-stack empty replies in this folder (run by hand, not by the tests).

    python tests/data/wire/empty/capture.py http://127.0.0.1:18431

Two ways a reply comes back with nothing in it although nothing went wrong in the server, each on
every protocol family llama-server speaks, streamed and not:

- `eos_*`: the model emits its end-of-sequence token first. The conversation is the one the
  `text` condition sent upstream after two get_weather results (eos_conversation.json, as
  recorded): Qwen2.5-Coder-0.5B answers it with its end token alone (`/completion` says
  `stop_type: eos`, `tokens_predicted: 1`).
- `stop_*`: a stop string the harness sent (smolagents' `Observation:` / `Calling tools:`) is the
  first thing the model writes, so the server cuts the reply before any text (`stop_type: word`).

Each body is written exactly as received; the tests decode these bytes and build the emulated
stack's answers to match them.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from capture import capture  # noqa: E402

STOPS = ["Observation:", "Calling tools:"]
ECHO = "Repeat exactly this line and nothing else:\nObservation: the tool said sunny"


def _families(name: str, messages: list[dict], extra: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    """One request per family for the same conversation; `extra` adds per-family fields (the stop strings)."""
    system, rest = (messages[0]["content"], messages[1:]) if messages[0]["role"] == "system" else (None, messages)
    chat = {"model": "m", "max_tokens": 200, "temperature": 0, "messages": messages, **extra.get("chat", {})}
    responses = {
        "model": "m",
        "max_output_tokens": 200,
        "temperature": 0,
        "input": [{"type": "message", "role": m["role"], "content": m["content"]} for m in rest],
        **({"instructions": system} if system else {}),
        **extra.get("responses", {}),
    }
    anthropic = {
        "model": "m",
        "max_tokens": 200,
        "temperature": 0,
        "messages": rest,
        **({"system": system} if system else {}),
        **extra.get("messages", {}),
    }
    out = {}
    for family, path, body in (
        ("chat", "/v1/chat/completions", chat),
        ("responses", "/v1/responses", responses),
        ("messages", "/v1/messages", anthropic),
    ):
        for stream in (False, True):
            out[f"{name}_{family}_{'stream' if stream else 'json'}"] = (path, {**body, "stream": stream})
    return out


def _rendered(base: str, messages: list[dict]) -> str:
    """The prompt llama-server's chat template makes of `messages` (its /apply-template)."""
    req = urllib.request.Request(
        base + "/apply-template",
        data=json.dumps({"messages": messages}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["prompt"]


def requests(base: str) -> dict[str, tuple[str, dict]]:
    eos = json.loads((HERE / "eos_conversation.json").read_text())
    out = _families("eos", eos, {})
    out["eos_completion_json"] = ("/completion", {"prompt": _rendered(base, eos), "n_predict": 200, "temperature": 0})
    # the chat stream without stream_options: no usage block, only llama.cpp's timings say how much was generated
    out["eos_chat_stream_usage"] = (
        "/v1/chat/completions",
        {**out["eos_chat_stream"][1], "stream_options": {"include_usage": True}},
    )
    echo = [{"role": "user", "content": ECHO}]
    out.update(
        _families(
            "stop", echo, {"chat": {"stop": STOPS}, "responses": {"stop": STOPS}, "messages": {"stop_sequences": STOPS}}
        )
    )
    prompt = f"<|im_start|>user\n{ECHO}<|im_end|>\n<|im_start|>assistant\n"
    for stream in (False, True):
        suffix = "stream" if stream else "json"
        out[f"stop_completion_{suffix}"] = (
            "/completion",
            {"prompt": prompt, "n_predict": 200, "temperature": 0, "stop": STOPS, "stream": stream},
        )
        out[f"stop_v1completions_{suffix}"] = (
            "/v1/completions",
            {"model": "m", "prompt": prompt, "max_tokens": 200, "temperature": 0, "stop": STOPS, "stream": stream},
        )
    return out


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18431"
    capture(url, requests(url), HERE)
