"""Record real smolagents ToolCallingAgent traffic through `toolproxy serve` (see README.md here).

Not part of the test suite: smolagents is not a toolproxy dependency. Run it by hand in a venv
that has toolproxy (editable) and smolagents installed:

    python tests/data/smolagents/capture.py STACK OUT_DIR     (STACK: openai, sglang or a URL)

It starts an emulated stack on 127.0.0.1 with a scripted model (openai: calls come back in
`tool_calls`; sglang launched without --tool-call-parser: they stay in the reply text as Hermes
`<tool_call>` blocks, which smolagents parses itself; a URL: that real server), runs `toolproxy serve`
in front of it as a subprocess (untagged: no run/episode/item tags), points smolagents'
OpenAIServerModel at the proxy and runs three tasks; the proxy's segment files land in
OUT_DIR/segments.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

from toolproxy.emulators import FakeStack, call

LISTENING = re.compile(r"listening on (http://\S+?)(?:\s|$)")


class Weather(Tool):
    name = "get_weather"
    description = "Current weather for a city."
    inputs = {"city": {"type": "string", "description": "City name"}}
    output_type = "string"

    def forward(self, city: str) -> str:
        return {"Paris": "sunny, 21 C", "Oslo": "rain, 9 C"}.get(city, "unknown")


# The scripted model: task 1 calls once then answers through smolagents' final_answer tool;
# task 2 calls twice then answers; task 3 (streamed) writes prose beside its call, which
# smolagents resends as a separate assistant message before the "Calling tools:" one.
SCRIPT = [
    call("get_weather", {"city": "Paris"}),
    call("final_answer", {"answer": "It is sunny in Paris, 21 C."}),
    call("get_weather", {"city": "Paris"}),
    call("get_weather", {"city": "Oslo"}),
    call("final_answer", {"answer": "Paris is warmer (21 C) than Oslo (9 C)."}),
    call("get_weather", {"city": "Oslo"}, content="Let me look that up."),
    call("final_answer", {"answer": "Rain in Oslo, 9 C."}),
]
TASKS = [
    ("What is the weather in Paris?", False),
    ("Which is warmer right now, Paris or Oslo?", False),
    ("Is it raining in Oslo?", True),
]


def start_proxy(upstream: str, data: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "serve",
            "--upstream",
            upstream,
            "--port",
            "0",
            "--data",
            str(data),
            "--durability",
            "sync",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        for line in proc.stdout:
            m = LISTENING.search(line)
            if m and not found:
                found.append(m.group(1).rstrip(";,"))
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(20):
        proc.terminate()
        raise SystemExit("toolproxy serve did not start")
    return proc, found[0]


def run_tasks(url: str, model_id: str, tasks, max_steps: int, **model_args) -> None:
    model = OpenAIServerModel(model_id=model_id, api_base=url + "/v1", api_key="sk-capture", **model_args)
    for task, stream in tasks:
        agent = ToolCallingAgent(
            tools=[Weather()], model=model, max_steps=max_steps, verbosity_level=0, stream_outputs=stream
        )
        try:
            print(task, "->", agent.run(task), flush=True)
        except Exception as exc:  # a real model may break the agent; the traffic is what we keep
            print(task, "-> failed:", type(exc).__name__, flush=True)


def main(stack: str, out: Path) -> None:
    """stack: a fake's name (scripted model), or the URL of a real server (the first two tasks,
    at most 3 steps each, 200 tokens a reply)."""
    if stack.startswith("http"):
        proc, url = start_proxy(stack, out)
        try:
            run_tasks(url, "qwen", TASKS[:2], 3, max_tokens=200)
        finally:
            proc.terminate()
            proc.wait(10)
        return
    fake = FakeStack(stack, replies=list(SCRIPT))
    with fake.in_thread() as upstream:
        proc, url = start_proxy(upstream, out)
        try:
            run_tasks(url, fake.model, TASKS, 4)
        finally:
            proc.terminate()
            proc.wait(10)
    time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
