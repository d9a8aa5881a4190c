"""A small, unmodified-style ReAct agent using the official openai SDK, to point at toolproxy.

    toolproxy serve --upstream http://127.0.0.1:11434 &
    python examples/react_agent.py --model qwen2.5:0.5b --run qwen-native --episodes 5
    toolproxy analyze && toolproxy report

The agent knows nothing about toolproxy: the only change is its base URL, which carries the run
and episode tags in a path prefix (`/t/run=NAME/episode=N/v1`). Tools run locally and their
results go back as `tool` messages, the way most harnesses do it.
"""

from __future__ import annotations

import argparse
import json
import math

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "unit_convert",
            "description": "Convert a value between km and miles.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "unit": {"type": "string", "enum": ["km", "mi"], "description": "the unit of value"},
                },
                "required": ["value", "unit"],
                "additionalProperties": False,
            },
        },
    },
]

TASKS = [
    "What is (17 * 23) + 11? Use the calculator.",
    "How many miles is 42.195 km?",
    "What is 2 to the power of 20, divided by 1024?",
    "Convert 26.2 miles to km, then add 10.",
    "What is the square of 12, minus 44?",
]


def run_tool(name: str, args: dict) -> str:
    if name == "calculator":
        expr = str(args.get("expression", ""))
        if not set(expr) <= set("0123456789+-*/(). "):
            return "error: only arithmetic is allowed"
        try:
            return str(eval(expr, {"__builtins__": {}}, {"math": math}))  # arithmetic characters only, checked above
        except Exception as exc:  # the model's expression, reported back to it
            return f"error: {exc}"
    if name == "unit_convert":
        value, unit = float(args.get("value", 0)), args.get("unit")
        return f"{value / 1.609344:.4f} mi" if unit == "km" else f"{value * 1.609344:.4f} km"
    return f"error: no tool named {name!r}"


def episode(client: OpenAI, model: str, task: str, max_turns: int, stream: bool) -> None:
    messages = [{"role": "system", "content": "You are a careful assistant. Use tools when they help."},
                {"role": "user", "content": task}]
    for _ in range(max_turns):
        if stream:
            content, calls = "", {}
            for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True):
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                content += delta.content or ""
                for tc in delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            tool_calls = [{"id": c["id"] or f"call_{i}", "type": "function",
                           "function": {"name": c["name"], "arguments": c["arguments"]}} for i, c in sorted(calls.items())]
        else:
            msg = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message
            content = msg.content or ""
            tool_calls = [tc.model_dump() for tc in msg.tool_calls or []]
        messages.append({"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})})
        if not tool_calls:
            print(f"  answer: {content.strip()[:120]!r}")
            return
        for tc in tool_calls:
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                args = {}
            result = run_tool(tc["function"]["name"], args)
            print(f"  {tc['function']['name']}({args}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
    print("  (gave up: turn limit)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxy", default="http://127.0.0.1:8787", help="toolproxy address")
    ap.add_argument("--model", required=True)
    ap.add_argument("--run", default="react")
    ap.add_argument("--condition", default=None, help="native|hint|text|constrained|template (tag per request)")
    ap.add_argument("--episodes", type=int, default=len(TASKS))
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--api-key", default="unused-by-local-servers")
    args = ap.parse_args()
    for i in range(args.episodes):
        cond = f"/condition={args.condition}" if args.condition else ""
        base = f"{args.proxy}/t/run={args.run}/episode={i}/item=task_{i % len(TASKS)}{cond}/v1"
        print(f"episode {i}: {TASKS[i % len(TASKS)]}")
        episode(OpenAI(base_url=base, api_key=args.api_key, max_retries=1), args.model, TASKS[i % len(TASKS)],
                args.max_turns, args.stream)


if __name__ == "__main__":
    main()
