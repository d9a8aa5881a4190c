"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, FastAPI).

As read in llama_cpp/server/app.py, errors.py and llama_chat_format.py (the release the catalog names) and observed
(tests/data/llamacpp_python/): every error is HTTP 500 in OpenAI's error shape (a request that
fails validation included, pydantic's report as the message); `tools` reach the prompt only when
`tool_choice` names a function, and then the reply is that call (ids `call__0_NAME_ID`, a legacy
`function_call` beside `tool_calls`); otherwise the tools are dropped and whatever call the model
writes stays in `content`. Replies name the model as the request did and carry no `timings`;
streamed chunks are dumped with Python's json.dumps spacing.
"""

from __future__ import annotations

import json
import time
import uuid

from toolproxy.emulators.base import Answer, Emulator
from toolproxy.stacks import catalog


def _py_json(obj) -> bytes:
    return json.dumps(obj).encode()


class LlamaCppPython(Emulator):
    profile = catalog.LLAMACPP_PYTHON
    call_format = "json"
    event_dumps = staticmethod(_py_json)

    def routes(self):
        return super().routes() + [("GET", "/openapi.json", self.openapi)]

    async def openapi(self, request, body):
        return self.json(
            200,
            {
                "openapi": "3.1.0",
                "info": {"title": catalog.OPENAPI_TITLE, "version": self.profile.version},
                "paths": {p: {m.lower(): {}} for m, p, _ in super().routes()},
            },
        )

    def not_found(self) -> Answer:
        return self.json(404, {"detail": "Not Found"})  # FastAPI's default

    def error(self, status, message, kind=None):
        # The server's error handler answers every failure of a completion route as a 500.
        return self.json(
            500, {"error": {"message": message, "type": kind or "internal_server_error", "param": None, "code": None}}
        )

    async def chat(self, request, body):
        messages = body.get("messages")
        if not isinstance(messages, list):
            report = {
                "type": "list_type",
                "loc": ("body", "messages"),
                "msg": "Input should be a valid list",
                "input": messages,
            }
            return self.failure(catalog.INVALID_REQUEST, rest=f"{report}\n\n    POST /v1/chat/completions")
        return await super().chat(request, body)

    def named_tool(self, req) -> str | None:
        choice = req.body.get("tool_choice")
        if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
            return choice["function"].get("name")
        return None

    def parses_calls(self, req):
        return self.named_tool(req) is not None

    def completion_id(self):
        return f"chatcmpl-{uuid.uuid4()}"

    def chat_body(self, req, content, native, finish, reply):
        cid = self.completion_id()
        msg = {"content": None if native else content}
        if native:
            calls = [
                {
                    "id": f"call__{i}_{c.name}_{cid[len('chat') :]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments or {})},
                }
                for i, c in enumerate(native)
            ]
            msg["tool_calls"] = calls
        msg["role"] = "assistant"
        if native:
            msg["function_call"] = calls[0]["function"]
        return {
            "id": cid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
            "usage": self.usage(req, content),
        }

    def first_delta(self):
        return {"role": "assistant"}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        return {
            "id": cid,
            "model": req.model,
            "created": created,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def model_entry(self, name):
        return {"id": name, "object": "model", "owned_by": self.profile.owned_by, "permissions": []}
