"""smolagents: a ToolCallingAgent with one tool on an OpenAI-compatible server.

    toolproxy run --upstream URL --run smolagents -- python examples/recipes/smolagents-agent.py [MODEL]

OpenAIModel (formerly OpenAIServerModel) without api_base builds an `openai.OpenAI()` client,
which reads OPENAI_BASE_URL and OPENAI_API_KEY; `toolproxy run` sets both. The agent finishes
by calling its own `final_answer` tool, so every turn of a good run is a tool call.
"""

import sys

from smolagents import OpenAIModel, ToolCallingAgent, tool
from weather import QUESTION, finish
from weather import get_weather as weather_service

calls = []


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: City name
    """
    calls.append(city)
    return weather_service(city)


model = OpenAIModel(model_id=sys.argv[1] if len(sys.argv) > 1 else "local")
agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=4, verbosity_level=0)
result = agent.run(QUESTION, return_full_result=True)
# at max_steps smolagents answers with a summary request of its own: state "max_steps_error"
finish(result.output, bool(calls), None if result.state == "success" else result.state)
