"""SGLang's OpenAI-compatible server (FastAPI): vLLM's shapes with its own fields and flat errors."""

from __future__ import annotations

import secrets
import time

from toolproxy.emulators.base import Emulator
from toolproxy.emulators.vllm import VLLM
from toolproxy.stacks import catalog


class SGLang(VLLM):
    """SGLang (FastAPI): python/sglang/srt/entrypoints/openai/serving_chat.py; flat ErrorResponse."""

    profile = catalog.SGLANG
    version = catalog.SGLANG.version

    def routes(self):
        return Emulator.routes(self) + [
            ("GET", "/health", self.health),
            ("GET", "/get_model_info", self.model_info),
            ("GET", "/get_server_info", self.server_info),
            ("GET", "/server_info", self.server_info),
        ]

    async def model_info(self, request, body):
        return self.json(
            200,
            {
                "model_path": self.fake.model,
                "tokenizer_path": self.fake.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
            },
        )

    async def server_info(self, request, body):
        return self.json(
            200,
            {
                "model_path": self.fake.model,
                "served_model_name": self.fake.model,
                "host": "127.0.0.1",
                "tool_call_parser": self.fake.tool_parser,
                "reasoning_parser": None,
                "chat_template": None,
                "context_length": self.fake.context_length,
                "enable_cache_report": self.fake.cached_tokens is not None,
                "version": self.version,
            },
        )

    def error(self, status, message, kind=None):
        kind = kind or {400: "BadRequest", 404: "NotFoundError"}.get(status, "InternalServerError")
        return self.json(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})

    def unknown_model(self, model):
        return None  # SGLang serves its one model whatever name the request gives

    def refuse_tools(self, req):
        return None  # tools are rendered; without a parser the call stays in content

    def parses_calls(self, req):
        return bool(self.fake.tool_parser) and self.tool_choice(req.body) != "none"

    def call_id(self):
        return "call_" + secrets.token_hex(12)

    def completion_id(self):
        return secrets.token_hex(16)

    def chat_body(self, req, content, native, finish, reply):
        msg = {
            "role": "assistant",
            "content": None if native and not content else content,
            "reasoning_content": reply.reasoning,
            "tool_calls": self.native_calls(native) or None,
        }
        usage = self.usage(req, content)
        usage["prompt_tokens_details"] = (
            None if self.fake.cached_tokens is None else {"cached_tokens": self.fake.cached_tokens}
        )
        return {
            "id": self.completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [
                {
                    "index": 0,
                    "message": msg,
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": self.matched(req, finish),
                }
            ],
            "usage": usage,
            "metadata": {"weight_version": "default"},
        }

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["matched_stop"] = self.matched(req, finish_reason)
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "choices": [choice],
            "usage": None,
        }

    def matched(self, req, finish):
        """matched_stop: the stop string that ended generation, or the id of the end token (Qwen's <|im_end|>)."""
        return req.stopped if req.stopped is not None else 151645 if finish == "stop" else None

    def model_entry(self, name):
        return {
            "id": name,
            "object": "model",
            "created": self.fake.created,
            "owned_by": "sglang",
            "root": name,
            "max_model_len": self.fake.context_length,
        }
