"""langgraph: the prebuilt ReAct agent graph (create_react_agent) over ChatOpenAI with one tool.

    toolproxy run --upstream URL --run langgraph -- python examples/recipes/langgraph-agent.py [MODEL]

ChatOpenAI (langchain-openai) reads OPENAI_API_BASE (then the SDK's OPENAI_BASE_URL) and
OPENAI_API_KEY, which `toolproxy run` sets; the graph loops model -> tools -> model until a reply
carries no tool call, on chat completions.
"""

import sys
import warnings

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from weather import QUESTION, SYSTEM, finish
from weather import get_weather as weather_service


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return weather_service(city)


with warnings.catch_warnings():  # deprecated in favour of langchain's create_agent, still shipped in 1.x
    warnings.simplefilter("ignore")
    agent = create_react_agent(
        ChatOpenAI(model=sys.argv[1] if len(sys.argv) > 1 else "local", temperature=0),
        tools=[get_weather],
        prompt=SYSTEM,
    )
state = agent.invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 8})
ran = any(isinstance(m, ToolMessage) and m.name == "get_weather" and m.status != "error" for m in state["messages"])
last = state["messages"][-1]
finish(last.content if isinstance(last, AIMessage) and not last.tool_calls else None, ran)
