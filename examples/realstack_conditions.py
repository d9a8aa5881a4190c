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
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "data" / "qwen2.5" / "tokenizer_config.json"
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]
CONDITIONS = ("native", "hint", "text", "constrained", "template")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"no answer from {url} within {timeout:.0f}s")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def records(data: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from toolproxy.record.segments import list_segments, read_segment

    return [line.record for seg in list_segments(data) for line in read_segment(seg) if line.record]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--realstack", default=os.environ.get("TOOLPROXY_REALSTACK", str(Path.home() / ".cache/toolproxy-realstack")))
    ap.add_argument("--keep-data", default=None, help="Keep the proxy's recordings here (default: a temp dir, removed).")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    # SIGTERM (e.g. from `timeout`) must still run the finally below that stops both servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    real = Path(args.realstack)
    server, model = real / "bin" / "llama-server", real / "models" / "qwen2.5-coder-0.5b.gguf"
    if not server.exists() or not model.exists():
        raise SystemExit(f"{server} or {model} missing: run shared/realstack/setup.sh first")
    data = Path(args.keep_data) if args.keep_data else Path(tempfile.mkdtemp(prefix="toolproxy-realstack-"))

    llama = proxy = None
    try:
        lport = free_port()
        llama = subprocess.Popen([str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(lport),
                                  "-c", "4096", "-t", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{lport}/health", llama, 120)
        proxy = subprocess.Popen(
            [sys.executable, "-c", "from toolproxy.cli import main; main()", "serve", "--upstream", f"http://127.0.0.1:{lport}",
             "--port", "0", "--data", str(data), "--stack", "llamacpp", "--chat-template", str(TEMPLATE), "--parser", "hermes",
             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        line = proxy.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            raise SystemExit(f"toolproxy did not start: {line}{proxy.stdout.read()}")
        base = match.group(1)
        print(f"llama-server on :{lport} (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), toolproxy on {base}\n")

        for condition in CONDITIONS:
            client = openai.OpenAI(base_url=f"{base}/t/run=realstack/condition={condition}/v1", api_key="none",
                                   max_retries=0, timeout=300)
            t0 = time.monotonic()
            r = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=MESSAGES, tools=TOOLS,
                                               temperature=0, max_tokens=200)
            msg, took = r.choices[0].message, time.monotonic() - t0
            calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
            print(f"== {condition}  ({took:.1f}s)  finish_reason={r.choices[0].finish_reason}")
            print(f"   tool_calls: {calls if calls else 'none'}")
            print("   content:    " + (json.dumps(msg.content, ensure_ascii=False) if msg.content is not None else "null"))
    finally:
        stop(proxy)
        stop(llama)

    print("\nrecords:")
    for rec in records(data):
        sent = rec.get("upstream_request") or {}
        print(f"   {rec['condition']:<12} {rec.get('client_status')} upstream {sent.get('path', rec['path'])}  "
              f"note: {rec.get('condition_note')}")
    if not args.keep_data:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
