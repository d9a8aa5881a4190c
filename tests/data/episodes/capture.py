"""Record a real harness's traffic through `toolproxy serve`, with the harness's own record beside it.

Not part of the test suite: the harnesses are not toolproxy dependencies. Each runs in a virtualenv
of its own (the pinned versions are in README.md here); this script runs in toolproxy's:

    python tests/data/episodes/capture.py CASE OUT_DIR --python HARNESS_VENV/bin/python [--upstream URL]

It starts an emulated stack on 127.0.0.1 with the case's scripted model (models.py), or uses the
real server at --upstream, runs `toolproxy serve` in front of it as a subprocess (untagged: no
run, episode or item tags), and runs harnesses/SCRIPT with the harness's interpreter pointed at
the proxy. The proxy's segment files land in OUT_DIR/segments, the harness's own record (its tool
executions, answers and steps) in OUT_DIR/harness.json.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from toolproxy.emulators import FakeStack

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]
from models import MODELS  # noqa: E402
from proxyprocess import ProxyProcess  # noqa: E402

# case -> (harness script, scripted model, emulated stack)
CASES = {
    "openai-threads": ("openai_threads.py", "weather_chat", "llamacpp"),
    "inspect-epochs": ("inspect_epochs.py", "weather_chat", "llamacpp"),
    "pydantic-retry": ("pydantic_retry.py", "empty_once", "llamacpp"),
    "smolagents-steps": ("smolagents_steps.py", "smolagents_steps", "openai"),
    "dspy-react": ("dspy_react.py", "dspy_react", "llamacpp"),
    # three identical episodes at once, each ending with an empty reply (analysis item: retries
    # never cross the call-id chaining)
    "openai-threads-empty": ("openai_threads.py", "empty_after_result", "llamacpp"),
    # max_steps reached right after a call written in text ran: the wrap-up continues the episode
    "smolagents-text": ("smolagents_text.py", "smolagents_text", "openai"),
    "langchain-react": ("langchain_react.py", "langchain_react", "llamacpp"),
}


def run(case: str, out: Path, python: str, upstream: str | None, timeout: float) -> int:
    script, model, stack = CASES[case]
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        fake = None if upstream else FakeStack(stack, responder=MODELS[model])
        with fake.in_thread() if fake else contextlib.nullcontext(upstream) as url:
            proxy = ProxyProcess(url, data, ("--durability", "sync"))
            try:
                model_id = fake.model if fake else "qwen"
                cmd = [
                    python,
                    str(HERE / "harnesses" / script),
                    "--base-url",
                    proxy.url + "/v1",
                    "--model",
                    model_id,
                    "--record",
                    str(out / "harness.json"),
                ] + ([] if fake else ["--max-tokens", "200"])
                try:
                    code = subprocess.run(cmd, timeout=timeout, cwd=tmp).returncode
                except subprocess.TimeoutExpired:  # a slow real model: keep what was recorded so far
                    code = 124
            finally:
                proxy.stop()
        (out / "segments").mkdir(exist_ok=True)
        for seg in sorted((data / "segments").glob("*.jsonl")):
            shutil.copy(seg, out / "segments" / seg.name)
    return code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--python", required=True, help="the harness virtualenv's interpreter")
    ap.add_argument("--upstream", default=None, help="a real server instead of the emulated stack")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    sys.exit(run(args.case, args.out, args.python, args.upstream, args.timeout))


if __name__ == "__main__":
    main()
