"""langchain-openai: ChatOpenAI with a bound tool, the usual invoke / ToolMessage loop.

    toolproxy run --upstream URL --run langchain -- python examples/recipes/langchain-openai.py [MODEL]

ChatOpenAI reads OPENAI_API_BASE (then the SDK's OPENAI_BASE_URL) and OPENAI_API_KEY; `toolproxy
run` sets all three. It speaks chat completions unless `use_responses_api=True` is given.
"""

import sys

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from weather import QUESTION, SYSTEM, finish
from weather import get_weather as weather_service


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return weather_service(city)


llm = ChatOpenAI(model=sys.argv[1] if len(sys.argv) > 1 else "local", temperature=0).bind_tools([get_weather])
messages = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
tool_ran = False
for _ in range(4):
    reply = llm.invoke(messages)
    messages.append(reply)
    if not reply.tool_calls:
        finish(reply.content, tool_ran)
        break
    for tc in reply.tool_calls:
        tool_ran |= tc["name"] == "get_weather"
        out = get_weather.invoke(tc["args"]) if tc["name"] == "get_weather" else "unknown tool"
        messages.append(ToolMessage(out, tool_call_id=tc["id"]))
else:
    finish(None, tool_ran)
