"""LM Studio's OpenAI-compatible server and its native model lists."""

from __future__ import annotations

import secrets
import time
from typing import Any

from toolproxy.emulators.base import Emulator
from toolproxy.emulators.encoding import LOWER, pretty_json, random_text
from toolproxy.stacks import catalog


class LMStudio(Emulator):
    """LM Studio: no refusal; models not trained for tools answer with [TOOL_REQUEST] text."""

    profile = catalog.LMSTUDIO
    json_type = "application/json; charset=utf-8"
    call_format = "lmstudio"

    def routes(self):
        return super().routes() + [
            ("GET", "/api/v1/models", self.native_models),
            ("GET", "/api/v0/models", self.beta_models),
        ]

    dumps = staticmethod(pretty_json)

    def error(self, status, message, kind=None):
        return self.json(status, {"error": message})

    def parses_calls(self, req):
        return "tools" in self.fake.capabilities_of(req.model)

    def chat_body(self, req, content, native, finish, reply):
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reply.reasoning:
            msg["reasoning_content"] = reply.reasoning
        if native:
            msg["tool_calls"] = self.native_calls(native)
        return {
            "id": "chatcmpl-" + random_text(LOWER, 20),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [{"index": 0, "logprobs": None, "finish_reason": finish, "message": msg}],
            "usage": self.usage(req, content),
            "stats": {},
            "system_fingerprint": req.model,
        }

    def call_id(self):
        return "".join(secrets.choice("0123456789") for _ in range(9))

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "system_fingerprint": req.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def model_entry(self, name):
        return {"id": name, "object": "model", "owned_by": self.profile.owned_by}

    async def native_models(self, request, body):
        return self.json(
            200,
            {
                "models": [
                    {
                        "type": "llm",
                        "publisher": "lmstudio-community",
                        "key": m,
                        "display_name": m,
                        "architecture": "qwen2",
                        "quantization": {"name": "Q4_K_M", "bits_per_weight": 4},
                        "size_bytes": 4683073952,
                        "params_string": "7B",
                        "loaded_instances": [],
                        "max_context_length": self.fake.context_length,
                        "format": "gguf",
                        "capabilities": {
                            "vision": False,
                            "trained_for_tool_use": "tools" in self.fake.capabilities_of(m),
                        },
                    }
                    for m in self.fake.models
                ]
            },
        )

    async def beta_models(self, request, body):
        """The older REST API (/api/v0, LM Studio 0.3.6+): an OpenAI-style list with LM Studio's fields."""
        return self.json(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": m,
                        "object": "model",
                        "type": "llm",
                        "publisher": "lmstudio-community",
                        "arch": "qwen2",
                        "compatibility_type": "gguf",
                        "quantization": "Q4_K_M",
                        "state": "not-loaded",
                        "max_context_length": self.fake.context_length,
                    }
                    for m in self.fake.models
                ],
            },
        )
