r"""pydantic-ai: an Agent with one tool, on chat completions through its `openai-chat:` models.

    toolproxy run --upstream URL --run pydantic-ai -- python examples/recipes/pydantic-ai.py [openai-chat:MODEL]
    toolproxy run --upstream http://127.0.0.1:11434 --run pydantic-ai-ollama -- \
        python examples/recipes/pydantic-ai.py ollama:MODEL

`openai-chat:` models read OPENAI_BASE_URL and OPENAI_API_KEY; `ollama:` models read
OLLAMA_BASE_URL (Ollama's OpenAI-compatible /v1). `toolproxy run` sets all of them. A bare
`openai:` model speaks the Responses API instead, which many local stacks do not serve.
"""

import sys

from pydantic_ai import Agent
from weather import QUESTION, SYSTEM, finish
from weather import get_weather as weather_service

agent = Agent(sys.argv[1] if len(sys.argv) > 1 else "openai-chat:local", system_prompt=SYSTEM)
calls = []


@agent.tool_plain
def get_weather(city: str) -> str:
    """Current weather for a city."""
    calls.append(city)
    return weather_service(city)


finish(agent.run_sync(QUESTION).output, bool(calls))
