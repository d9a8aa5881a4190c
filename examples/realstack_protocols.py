"""Real-stack check of the Responses and Messages protocols: the openai SDK's `responses.create`
and the anthropic SDK's `messages.create`, with a tool, streaming and not, through `toolproxy
serve` in front of a running llama-server (Qwen2.5-Coder-0.5B writes its call as text there);
then `toolproxy analyze` on what was recorded, and the same requests under the `text` condition,
which must hand back native `function_call` items and `tool_use` blocks.

Not part of CI. Point it at a llama-server started with --jinja:

    python examples/realstack_protocols.py --upstream http://127.0.0.1:18431
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import anthropic
import openai

sys.path.insert(0, str(Path(__file__).parent))
from realstack import proxy  # noqa: E402

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = "What is the weather in Paris? Use the tool."


def responses(base: str, condition: str, stream: bool):
    client = openai.OpenAI(base_url=f"{base}/t/run=responses-{condition}/condition={condition}/v1", api_key="sk-none")
    kwargs = dict(model="qwen", input=ASK, tools=[{"type": "function", **WEATHER}], temperature=0, max_output_tokens=80)
    if stream:
        return list(client.responses.create(stream=True, **kwargs))[-1].response
    return client.responses.create(**kwargs)


def messages(base: str, condition: str, stream: bool):
    client = anthropic.Anthropic(base_url=f"{base}/t/run=messages-{condition}/condition={condition}", api_key="sk-none")
    kwargs = dict(
        model="qwen",
        max_tokens=80,
        messages=[{"role": "user", "content": ASK}],
        tools=[{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}],
    )
    if stream:
        with client.messages.stream(**kwargs) as s:
            return s.get_final_message()
    return client.messages.create(**kwargs)


def toolproxy(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "toolproxy.cli", *args], capture_output=True, text=True, check=True)
    return out.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", default="http://127.0.0.1:18431")
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="toolproxy-protocols-"))
    with proxy(args.upstream, data, "--durability", "sync", "--quiet") as base:
        for condition in ("native", "text"):
            for stream in (False, True):
                r = responses(base, condition, stream)
                items = [
                    (i.type, i.name, i.arguments) if i.type == "function_call" else (i.type, r.output_text)
                    for i in r.output
                ]
                print(f"responses.create {condition:6} stream={stream!s:5} -> {items}")
                m = messages(base, condition, stream)
                blocks = [(b.type, b.name, b.input) if b.type == "tool_use" else (b.type, b.text) for b in m.content]
                print(f"messages.create  {condition:6} stream={stream!s:5} -> {blocks} stop_reason={m.stop_reason}")
    print(toolproxy("analyze", "--data", str(data)).strip())
    rows = toolproxy(
        "sql",
        "--data",
        str(data),
        "--format",
        "json",
        "SELECT t.run, t.outcome, t.surface, c.name, c.format, c.valid, e.prompt_tokens, e.cached_tokens "
        "FROM turns t JOIN calls c USING (turn_id) JOIN exchanges e ON e.id = t.final_exchange_id ORDER BY t.run",
    )
    for row in json.loads(rows):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
