"""anthropic SDK: a Messages API (/v1/messages) tool loop with the official client.

    toolproxy run --upstream URL --run anthropic -- python examples/recipes/anthropic-sdk.py [MODEL]

`Anthropic()` reads ANTHROPIC_BASE_URL (it appends /v1/messages) and ANTHROPIC_API_KEY, which
`toolproxy run` sets. The stack must serve /v1/messages (recent llama-server, vLLM, SGLang do),
or put `toolproxy serve --bridge messages` in front of a chat-only one.
"""

import sys

from anthropic import Anthropic
from weather import DESCRIPTION, PARAMETERS, QUESTION, SYSTEM, finish, get_weather

model = sys.argv[1] if len(sys.argv) > 1 else "local"
client = Anthropic()
tools = [{"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMETERS}]
messages = [{"role": "user", "content": QUESTION}]
tool_ran = False
for _ in range(4):
    reply = client.messages.create(model=model, max_tokens=512, system=SYSTEM, messages=messages, tools=tools)
    uses = [b for b in reply.content if b.type == "tool_use"]
    if not uses:
        finish("".join(b.text for b in reply.content if b.type == "text"), tool_ran)
        break
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
    results = []
    for use in uses:
        tool_ran |= use.name == "get_weather"
        out = get_weather(**use.input) if use.name == "get_weather" else "unknown tool"
        results.append({"type": "tool_result", "tool_use_id": use.id, "content": out})
    messages.append({"role": "user", "content": results})
else:
    finish(None, tool_ran)
