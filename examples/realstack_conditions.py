"""One request per interface condition against a real llama-server running Qwen2.5-Coder-0.5B.

Not part of CI: it needs the real stack built by shared/realstack/setup.sh (about 10 minutes,
once per machine). It starts llama-server and `toolproxy serve` on free 127.0.0.1 ports, sends
the same tool-using question under native, hint, text, constrained and template (selected per
request with the `condition=` path tag, so one proxy serves every arm), prints what the harness
got back and what the record says, and stops both servers.

    python examples/realstack_conditions.py [--realstack DIR] [--keep-data DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).parent))
from realstack import llama_server, proxy  # noqa: E402

from toolproxy.record.segments import read_records  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "data" / "qwen2.5" / "tokenizer_config.json"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]
CONDITIONS = ("native", "hint", "text", "constrained", "template")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--keep-data", default=None, help="Keep the proxy's recordings here (default: a temp dir, removed)."
    )
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    # SIGTERM (e.g. from `timeout`) must still run the context exits that stop both servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data = Path(args.keep_data) if args.keep_data else Path(tempfile.mkdtemp(prefix="toolproxy-realstack-"))
    serve_args = ("--stack", "llamacpp", "--chat-template", str(TEMPLATE), "--parser", "hermes", "--quiet")
    with llama_server("qwen") as upstream, proxy(upstream, data, *serve_args) as base:
        print(f"llama-server at {upstream} (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), toolproxy on {base}\n")
        for condition in CONDITIONS:
            client = openai.OpenAI(
                base_url=f"{base}/t/run=realstack/condition={condition}/v1", api_key="none", max_retries=0, timeout=300
            )
            t0 = time.monotonic()
            r = client.chat.completions.create(
                model="qwen2.5-coder-0.5b", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=200
            )
            msg, took = r.choices[0].message, time.monotonic() - t0
            calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
            print(f"== {condition}  ({took:.1f}s)  finish_reason={r.choices[0].finish_reason}")
            print(f"   tool_calls: {calls if calls else 'none'}")
            print(
                "   content:    " + (json.dumps(msg.content, ensure_ascii=False) if msg.content is not None else "null")
            )

    print("\nrecords:")
    for rec in read_records(data):
        sent = rec.get("upstream_request") or {}
        print(
            f"   {rec['condition']:<12} {rec.get('client_status')} upstream {sent.get('path', rec['path'])}  "
            f"note: {rec.get('condition_note')}"
        )
    if not args.keep_data:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
