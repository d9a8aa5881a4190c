r"""litellm: `litellm.completion` with a tool, through its openai/ provider (or ollama_chat/ for Ollama).

    toolproxy run --upstream URL --run litellm -- python examples/recipes/litellm-sdk.py [openai/MODEL]
    toolproxy run --upstream http://127.0.0.1:11434 --run litellm-ollama -- \
        python examples/recipes/litellm-sdk.py ollama_chat/MODEL

The openai/ provider reads OPENAI_BASE_URL (then OPENAI_API_BASE) and OPENAI_API_KEY; ollama/ and
ollama_chat/ read OLLAMA_API_BASE; hosted_vllm/ reads HOSTED_VLLM_API_BASE. `toolproxy run` sets
them all, and LITELLM_LOCAL_MODEL_COST_MAP=True so litellm does not fetch its price list at import.
"""

import json
import sys

import litellm
from weather import CHAT_TOOL, QUESTION, SYSTEM, finish, get_weather

model = sys.argv[1] if len(sys.argv) > 1 else "openai/local"
messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
tool_ran = False
for _ in range(4):
    msg = litellm.completion(model=model, messages=messages, tools=[CHAT_TOOL]).choices[0].message
    if not msg.tool_calls:
        finish(msg.content, tool_ran)
        break
    messages.append(msg.model_dump(exclude_none=True))
    for tc in msg.tool_calls:
        tool_ran |= tc.function.name == "get_weather"
        out = get_weather(**json.loads(tc.function.arguments)) if tc.function.name == "get_weather" else "unknown tool"
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": out})
else:
    finish(None, tool_ran)
