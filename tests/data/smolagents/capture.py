"""Record real smolagents ToolCallingAgent traffic through `toolproxy serve` (see README.md here).

Not part of the test suite: smolagents is not a toolproxy dependency. Run it by hand in a venv
that has toolproxy (editable) and smolagents installed:

    python tests/data/smolagents/capture.py STACK OUT_DIR     (STACK: openai or sglang)

It starts an emulated stack on 127.0.0.1 with a scripted model (openai: calls come back in
`tool_calls`; sglang launched without --tool-call-parser: they stay in the reply text as Hermes
`<tool_call>` blocks, which smolagents parses itself), runs `toolproxy serve`
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

from toolproxy.stacks.fakes import FakeStack, call

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
TASKS = [("What is the weather in Paris?", False), ("Which is warmer right now, Paris or Oslo?", False),
         ("Is it raining in Oslo?", True)]


def start_proxy(upstream: str, data: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolproxy.cli", "serve", "--upstream", upstream, "--port", "0", "--data", str(data),
         "--durability", "sync"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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


def main(stack: str, out: Path) -> None:
    fake = FakeStack(stack, replies=list(SCRIPT))
    with fake.in_thread() as upstream:
        proc, url = start_proxy(upstream, out)
        try:
            model = OpenAIServerModel(model_id=fake.model, api_base=url + "/v1", api_key="sk-capture")
            for task, stream in TASKS:
                agent = ToolCallingAgent(tools=[Weather()], model=model, max_steps=4, verbosity_level=0,
                                         stream_outputs=stream)
                print(task, "->", agent.run(task))
        finally:
            proc.terminate()
            proc.wait(10)
    time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
