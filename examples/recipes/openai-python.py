"""openai-python: a plain chat-completions tool loop with the official SDK.

    toolproxy run --upstream URL --run openai-python -- python examples/recipes/openai-python.py [MODEL]

`OpenAI()` reads OPENAI_BASE_URL and OPENAI_API_KEY, which `toolproxy run` sets.
"""

import json
import sys

from openai import OpenAI
from weather import CHAT_TOOL, QUESTION, SYSTEM, finish, get_weather

model = sys.argv[1] if len(sys.argv) > 1 else "local"
client = OpenAI()
messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
tool_ran = False
for _ in range(4):
    msg = client.chat.completions.create(model=model, messages=messages, tools=[CHAT_TOOL]).choices[0].message
    if not msg.tool_calls:
        finish(msg.content, tool_ran)
        break
    messages.append(msg.model_dump(exclude_none=True))
    for tc in msg.tool_calls:
        result = (
            get_weather(**json.loads(tc.function.arguments)) if tc.function.name == "get_weather" else "unknown tool"
        )
        tool_ran |= tc.function.name == "get_weather"
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
else:
    finish(None, tool_ran)
