"""pydantic-ai: one tool, one task; when a reply comes back empty, pydantic-ai drops it and asks
again with a note of its own ("Please return text or call a tool.")."""

from __future__ import annotations

import pydantic_ai
from common import Log, arguments, weather
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

TASK = "What is the weather in Paris?"


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    log = Log(args.record, f"pydantic-ai-slim {pydantic_ai.__version__}")
    model = OpenAIChatModel(args.model, provider=OpenAIProvider(base_url=args.base_url, api_key="sk-capture"))
    settings = {"max_tokens": args.max_tokens} if args.max_tokens else None
    agent = Agent(model, system_prompt="You are a helpful assistant.", model_settings=settings)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        result = weather(city)
        log.executed("task-0", "get_weather", {"city": city}, result)
        return result

    try:
        result = agent.run_sync(TASK)
        answer, messages = result.output, result.all_messages()
    except Exception as exc:  # a real model may exhaust the retries; the traffic is what we keep
        answer, messages = None, []
        log.doc["error"] = f"{type(exc).__name__}: {exc}"
    log.episode(
        "task-0",
        TASK,
        answer,
        steps=[
            {
                "kind": m.kind,
                "parts": [
                    {
                        "part_kind": p.part_kind,
                        "content": getattr(p, "content", None),
                        "tool_name": getattr(p, "tool_name", None),
                    }
                    for p in m.parts
                ],
            }
            for m in messages
        ],
    )
    log.write()


if __name__ == "__main__":
    main()
