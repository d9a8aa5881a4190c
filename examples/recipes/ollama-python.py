"""ollama Python client: Ollama's native /api/chat with a tool, the client's own tool loop idiom.

    toolproxy run --upstream http://127.0.0.1:11434 --run ollama -- python examples/recipes/ollama-python.py [MODEL]

`ollama.Client()` reads OLLAMA_HOST (a base path after the port is kept), which `toolproxy run`
sets; MODEL must be one the Ollama server has pulled, with the `tools` capability.
"""

import sys

from ollama import Client
from weather import CHAT_TOOL, QUESTION, SYSTEM, finish, get_weather

model = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5:7b"
client = Client()
messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
tool_ran = False
for _ in range(4):
    msg = client.chat(model=model, messages=messages, tools=[CHAT_TOOL]).message
    if not msg.tool_calls:
        finish(msg.content, tool_ran)
        break
    messages.append(msg)
    for tc in msg.tool_calls:
        tool_ran |= tc.function.name == "get_weather"
        out = get_weather(**tc.function.arguments) if tc.function.name == "get_weather" else "unknown tool"
        messages.append({"role": "tool", "tool_name": tc.function.name, "content": out})
else:
    finish(None, tool_ran)
