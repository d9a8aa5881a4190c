"""Three threads of the openai SDK asking the same question at the same time (one tool, a loop
of at most four turns each): identical conversations in flight together."""

from __future__ import annotations

import json
import threading

import openai
from common import Log, arguments, weather

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TASK = "What is the weather in Paris?"


def episode(client: openai.OpenAI, args, log: Log, name: str, start: threading.Barrier) -> None:
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": TASK}]
    extra = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    start.wait()
    for _ in range(4):
        reply = client.chat.completions.create(model=args.model, messages=messages, tools=TOOLS, **extra)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            log.episode(name, TASK, msg.content, turns=len([m for m in messages if m["role"] == "assistant"]))
            return
        for tc in msg.tool_calls:
            try:
                call_args = json.loads(tc.function.arguments)
            except json.JSONDecodeError:
                call_args = {}
            result = weather(call_args.get("city")) if isinstance(call_args, dict) else "error: bad arguments"
            log.executed(name, tc.function.name, call_args, result)
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    log.episode(name, TASK, None, turns=4, stopped="turn limit")


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    log = Log(args.record, f"openai {openai.__version__}")
    client = openai.OpenAI(base_url=args.base_url, api_key="sk-capture", max_retries=0, timeout=900)
    start = threading.Barrier(3)
    threads = [threading.Thread(target=episode, args=(client, args, log, f"thread-{i}", start)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.write()


if __name__ == "__main__":
    main()
