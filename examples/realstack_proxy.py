"""Real-stack check of the recording proxy (issue 2): the openai SDK through toolproxy in front of
a real llama.cpp server, with tools, streaming and not. Shows that the client got exactly the
bytes the server sent and that each exchange was recorded.

    python examples/realstack_proxy.py      # the real stack: docs/stacks.md#a-real-llamacpp-for-the-real-stack-scripts
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).parent))
from realstack import llama_server, proxy  # noqa: E402

from toolproxy.record.model import body_bytes  # noqa: E402
from toolproxy.record.segments import list_segments, read_records  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:16]


def main() -> int:
    data = Path(tempfile.mkdtemp(prefix="toolproxy-realstack-"))
    got: list[tuple[str, bytes]] = []
    with llama_server("qwen") as upstream, proxy(upstream, data, "--durability", "sync", "--quiet") as base:
        client = OpenAI(base_url=f"{base}/t/run=realstack/episode=1/v1", api_key="sk-not-a-real-key")
        raw = client.chat.completions.with_raw_response.create(
            model="qwen", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=96
        )
        body = raw.http_response.read()
        got.append(("non-stream", body))
        msg = raw.parse().choices[0].message
        print(
            f"non-stream: HTTP {raw.http_response.status_code}, finish_reason={raw.parse().choices[0].finish_reason}, "
            f"tool_calls={msg.tool_calls}, content={msg.content!r}"
        )
        with client.chat.completions.with_streaming_response.create(
            model="qwen",
            messages=MESSAGES,
            tools=TOOLS,
            temperature=0,
            max_tokens=96,
            stream=True,
            stream_options={"include_usage": True},
        ) as resp:
            stream_bytes = b"".join(resp.iter_bytes())
        got.append(("stream", stream_bytes))
        events = [line for line in stream_bytes.split(b"\n") if line.startswith(b"data: ")]
        print(f"stream: {len(events)} SSE events, last {events[-1][:40]!r}")
    records = read_records(data, kind="exchange")
    fingerprints = [r["extra"] for r in read_records(data, kind="fingerprint")]
    for fp in fingerprints:
        print(
            f"fingerprint: stack {fp.get('stack')} {fp.get('version') or ''} build {fp.get('build')} model "
            f"{fp.get('model')}"
        )
    print(f"\n{len(records)} records in {data}")
    ok = len(records) == len(got)
    for (label, client_bytes), rec in zip(got, records):
        recorded = body_bytes(rec["response_body"], rec["response_body_encoding"])
        same = recorded == client_bytes
        ok &= same
        auth = dict(rec["request_headers"]).get("Authorization")
        print(
            f"{label}: status {rec['status']}, {len(client_bytes)} bytes to client sha {sha(client_bytes)}, "
            f"recorded sha {sha(recorded)} -> {'IDENTICAL' if same else 'DIFFERENT'}; "
            f"Authorization on disk: {auth}; ttfb {rec['ttfb_ms']:.0f} ms, total {rec['duration_ms']:.0f} ms"
        )
    secret_on_disk = any(b"sk-not-a-real-key" in p.read_bytes() for p in list_segments(data))
    print(f"API key found on disk: {secret_on_disk}")
    return 0 if ok and not secret_on_disk else 1


if __name__ == "__main__":
    sys.exit(main())
