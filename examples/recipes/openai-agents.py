"""openai-agents: an Agent with one function tool, on its default Responses path or on chat completions.

    toolproxy run --upstream URL --run agents-responses -- python examples/recipes/openai-agents.py [MODEL]
    toolproxy run --upstream URL --run agents-chat -- python examples/recipes/openai-agents.py --chat [MODEL]

The SDK's default client reads OPENAI_BASE_URL and OPENAI_API_KEY; `toolproxy run` also sets
OPENAI_AGENTS_DISABLE_TRACING=1 so it does not try to export traces to OpenAI. By default the SDK
speaks the Responses API (/v1/responses), which many local stacks do not serve: `--chat` switches
it to chat completions, or put `toolproxy serve --bridge responses` in front of a chat-only stack.
"""

import sys

from agents import Agent, Runner, function_tool, set_default_openai_api
from weather import QUESTION, SYSTEM, finish, get_weather

args = [a for a in sys.argv[1:] if a != "--chat"]
if "--chat" in sys.argv:
    set_default_openai_api("chat_completions")
calls = []


@function_tool(name_override="get_weather")
def weather(city: str) -> str:
    """Current weather for a city."""
    calls.append(city)
    return get_weather(city)


agent = Agent(name="assistant", instructions=SYSTEM, tools=[weather], model=args[0] if args else "local")
result = Runner.run_sync(agent, QUESTION, max_turns=4)
finish(result.final_output, bool(calls))
