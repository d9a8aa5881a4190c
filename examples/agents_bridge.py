"""openai-agents' default path (Agent + Runner, which speaks OpenAI Responses) completing a
one-tool task through `toolproxy serve --bridge responses` in front of a stack that only speaks
chat completions (the emulated vLLM with a tool parser, which answers 404 on /v1/responses).

Not part of CI (needs `pip install openai-agents`); runs in a few seconds, on 127.0.0.1 only:

    python examples/agents_bridge.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from agents import Agent, Runner, function_tool, set_default_openai_api, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).parent))
from realstack import proxy  # noqa: E402

from toolproxy.emulators import FakeStack, ModelRequest, call, text  # noqa: E402
from toolproxy.record.segments import read_records  # noqa: E402

MODEL = "qwen2.5-7b-instruct"  # no "/": openai-agents reads "a/b" as provider "a"


def model(req: ModelRequest):
    """Calls the tool first; once the tool's result is in the conversation, answers with it."""
    result = next((m.get("content") for m in req.messages if m.get("role") == "tool"), None)
    return text(f"The weather in Oslo: {result}.") if result else call("get_weather", {"city": "Oslo"})


@function_tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"18 C and sunny in {city}"


def main() -> int:
    set_tracing_disabled(True)  # nothing leaves 127.0.0.1
    set_default_openai_api("responses")  # the default, spelled out
    fake = FakeStack("vllm", tool_parser="hermes", responder=model, models={MODEL: ("completion", "tools")})
    data = Path(tempfile.mkdtemp(prefix="toolproxy-agents-"))
    with fake.in_thread(), proxy(fake.url, data, "--bridge", "responses", "--durability", "sync", "--quiet") as base:
        set_default_openai_client(AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-none"), use_for_tracing=False)
        agent = Agent(name="weather", instructions="Answer with the tool's result.", model=MODEL, tools=[get_weather])
        result = Runner.run_sync(agent, "What is the weather in Oslo?")
        print("final output:", result.final_output)
        print("items:", [type(i).__name__ for i in result.new_items])
    for rec in read_records(data, "exchange"):
        up = (rec.get("upstream_request") or {}).get("path")
        print(
            f"record: {rec['method']} {rec['path']} -> {rec['status']}  sent upstream as {up}  note: "
            f"{rec.get('condition_note')}"
        )
    print("upstream saw:", [(s.method, s.path) for s in fake.seen])
    return 0 if "18 C" in str(result.final_output) else 1


if __name__ == "__main__":
    sys.exit(main())
