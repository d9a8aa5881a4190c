"""Ollama (Go, gin): its OpenAI-compatible /v1 routes and its native /api routes (NDJSON streams)."""

from __future__ import annotations

import secrets
import time
from typing import Any

import toolproxy.emulators.encoding as encoding
from toolproxy.emulators.base import Answer, Emulator, usage_tokens
from toolproxy.emulators.encoding import LOWER, SSE_DONE, go_encoder, go_json, go_numbers, random_text, sse
from toolproxy.emulators.model import ModelRequest, ToolCall, args_compact, render_calls, text
from toolproxy.stacks import catalog


class Ollama(Emulator):
    """Ollama (Go, gin): server/routes.go, server/images.go CheckCapabilities, openai/openai.go."""

    profile = catalog.OLLAMA
    # /v1 routes: the openai middleware sets "application/json" itself and uses json.Encoder
    # (a trailing newline); native routes: gin's c.JSON (charset, no newline).
    json_type = "application/json"
    native_type = "application/json; charset=utf-8"
    sse_type = "text/event-stream"
    ndjson_type = "application/x-ndjson"
    dumps = staticmethod(go_encoder)
    event_dumps = staticmethod(go_json)
    version = catalog.OLLAMA.version

    def routes(self):
        return super().routes() + [
            ("GET", "/", self.root),
            ("HEAD", "/", self.root),
            ("GET", "/api/version", self.version_route),
            ("GET", "/api/tags", self.tags),
            ("POST", "/api/show", self.show),
            ("POST", "/api/chat", self.native_chat),
            ("POST", "/api/generate", self.generate),
            ("GET", "/api/ps", self.ps),
        ]

    def native_json(self, status: int, obj: Any) -> Answer:
        return Answer(status, self.native_type, [go_json(obj)])

    def not_found(self) -> Answer:
        return Answer(404, "text/plain", [b"404 page not found"])  # gin's default

    async def root(self, request, body):
        return Answer(200, "text/plain; charset=utf-8", [self.profile.banner.encode()])

    async def version_route(self, request, body):
        return self.native_json(200, {"version": self.version})

    def full_name(self, model: str) -> str:
        name = model if ":" in model.rsplit("/", 1)[-1] else model + ":latest"
        return name if "/" in name else "registry.ollama.ai/library/" + name

    def resolve_model(self, model: str) -> str | None:
        for m in self.fake.models:
            if model in (m, m.removesuffix(":latest")) or self.full_name(model) == self.full_name(m):
                return m
        return None

    # -- errors: native routes are flat strings, /v1 routes go through openai.NewError
    def native_error(self, status: int, message: str) -> Answer:
        return self.native_json(status, {"error": message})

    def error(self, status, message, kind=None):
        kind = kind or {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
        return self.json(status, {"error": {"message": message, "type": kind, "param": None, "code": None}})

    def failed(self, kind: str, native: bool, **values: Any) -> Answer:
        """A catalogued failure in the error format of the route it came through."""
        f = self.profile.failures[kind]
        return (self.native_error if native else self.error)(f.status, f.text(**values))

    def unknown_model(self, model):
        return None if self.resolve_model(model) else self.failed(catalog.UNKNOWN_MODEL, False, model=model)

    def _refuses(self, req: ModelRequest) -> bool:
        return bool(req.body.get("tools")) and "tools" not in self.fake.capabilities_of(
            self.resolve_model(req.model) or req.model
        )

    def refuse_tools(self, req):
        return self.failed(catalog.TOOL_REFUSAL, False, model=self.full_name(req.model)) if self._refuses(req) else None

    def constraint(self, body):
        if "format" in body and body["format"] not in (None, ""):
            return body["format"]
        return super().constraint(body)

    def broken(self, req, raw_text):
        if req.tools:
            return self.failed(catalog.PARSE_FAILURE, not req.path.startswith("/v1"))
        return text(raw_text)

    def resolve(self, req, reply):
        content, native = super().resolve(req, reply)
        offered = set(req.tools)
        kept = [ToolCall(c.name, go_numbers(c.arguments)) for c in native if c.name in offered]
        if native and not kept:
            # the generic parser matched nothing it was offered: the call is dropped, its tokens counted
            req.eaten = render_calls(self.fake.call_format or self.call_format, native)
            return "", []
        return content, kept

    def call_id(self):
        return "call_" + random_text(LOWER, 8)

    def completion_id(self):
        return f"chatcmpl-{secrets.randbelow(999)}"

    def native_calls(self, cs):
        return [
            {
                "id": self.call_id(),
                "index": i,
                "type": "function",
                "function": {"name": c.name, "arguments": args_compact(c.arguments)},
            }
            for i, c in enumerate(cs)
        ]

    def chat_body(self, req, content, native, finish, reply):
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reply.reasoning:
            msg["reasoning"] = reply.reasoning
        if native:
            msg["tool_calls"] = self.native_calls(native)
        return {
            "id": self.completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "system_fingerprint": self.profile.system_fingerprint,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": self.usage(req, content),
        }

    def chat_stream(self, req, content, native, finish, reply):
        """Ollama /v1: content pieces, each tool call whole in one chunk, finish_reason on its own."""
        cid, created = self.completion_id(), int(time.time())

        def chunk(delta, finish_reason=None):
            return sse(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": req.model,
                    "system_fingerprint": self.profile.system_fingerprint,
                    "choices": [{"index": 0, "delta": {"role": "assistant", **delta}, "finish_reason": finish_reason}],
                },
                go_json,
            )

        events = [chunk({"content": p}) for p in encoding.pieces(content)] if content else []
        if native:
            events.append(chunk({"content": "", "tool_calls": self.native_calls(native)}))
        events.append(chunk({"content": ""}, finish))
        so = req.body.get("stream_options")
        if isinstance(so, dict) and so.get("include_usage"):
            events.append(
                sse(
                    {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": req.model,
                        "system_fingerprint": self.profile.system_fingerprint,
                        "choices": [],
                        "usage": self.usage(req, content),
                    },
                    go_json,
                )
            )
        events.append(SSE_DONE)
        return events

    def model_entry(self, name):
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": self.profile.owned_by}

    # -- native API
    def _stamp(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % 1_000_000_000:09d}Z"

    def _metrics(self, req: ModelRequest, out: str) -> dict:
        p, c = usage_tokens(req, out)
        return {
            "total_duration": 512345678,
            "load_duration": 12345678,
            "prompt_eval_count": p,
            "prompt_eval_duration": 123456789,
            "eval_count": c,
            "eval_duration": 345678901,
        }

    def _details(self, model: str) -> dict:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": "qwen2",
            "families": ["qwen2"],
            "parameter_size": "7.6B",
            "quantization_level": "Q4_K_M",
        }

    async def tags(self, request, body):
        return self.native_json(
            200,
            {
                "models": [
                    {
                        "name": m,
                        "model": m,
                        "modified_at": "2025-09-01T10:00:00.000000000Z",
                        "size": 4683087332,
                        "digest": secrets.token_hex(32),
                        "details": self._details(m),
                    }
                    for m in self.fake.models
                ]
            },
        )

    async def ps(self, request, body):
        return self.native_json(200, {"models": []})

    async def show(self, request, body):
        name = body.get("model") or body.get("name") or ""
        model = self.resolve_model(name)
        if model is None:
            return self.native_error(404, f"model '{name}' not found")
        return self.native_json(
            200,
            {
                "license": "Apache License 2.0",
                "modelfile": f'FROM {model}\nTEMPLATE """{self.profile.chat_template}"""\n',
                "parameters": 'stop                           "<|im_start|>"\nstop                           '
                '"<|im_end|>"',
                "template": self.profile.chat_template
                if "tools" in self.fake.capabilities_of(model)
                else "{{ .Prompt }}",
                "details": self._details(model),
                "model_info": {
                    "general.architecture": "qwen2",
                    "general.parameter_count": 7615616512,
                    "qwen2.context_length": self.fake.context_length,
                },
                "capabilities": list(self.fake.capabilities_of(model)),
                "modified_at": "2025-09-01T10:00:00.000000000Z",
            },
        )

    async def native_chat(self, request, body):
        req = self.fake.model_request(self, request.path, body)
        if "stream" not in body:
            req.stream = True  # Ollama's native API streams unless told not to
        model = self.resolve_model(req.model)
        if model is None:
            return self.failed(catalog.UNKNOWN_MODEL, True, model=req.model)
        if self._refuses(req):
            return self.failed(catalog.TOOL_REFUSAL, True, model=self.full_name(req.model))
        out = self.model_output(req, self.native_error)
        if isinstance(out, Answer):
            return out
        reply, content, native = out
        tool_calls = [
            {
                "id": self.call_id(),
                "function": {
                    "index": i,
                    "name": c.name,
                    "arguments": c.arguments if isinstance(c.arguments, dict) else {},
                },
            }
            for i, c in enumerate(native)
        ]
        finish = reply.finish_reason or "stop"
        base = {"model": req.model}
        if not req.stream:
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if reply.reasoning:
                msg["thinking"] = reply.reasoning
            if tool_calls:
                msg["tool_calls"] = tool_calls
            return self.native_json(
                200,
                {
                    **base,
                    "created_at": self._stamp(),
                    "message": msg,
                    "done_reason": finish,
                    "done": True,
                    **self._metrics(req, content),
                },
            )
        lines = []
        if reply.reasoning:
            lines += [
                {
                    **base,
                    "created_at": self._stamp(),
                    "message": {"role": "assistant", "content": "", "thinking": p},
                    "done": False,
                }
                for p in encoding.pieces(reply.reasoning)
            ]
        if content:
            lines += [
                {**base, "created_at": self._stamp(), "message": {"role": "assistant", "content": p}, "done": False}
                for p in encoding.pieces(content)
            ]
        if tool_calls:
            lines.append(
                {
                    **base,
                    "created_at": self._stamp(),
                    "message": {"role": "assistant", "content": "", "tool_calls": tool_calls},
                    "done": False,
                }
            )
        lines.append(
            {
                **base,
                "created_at": self._stamp(),
                "message": {"role": "assistant", "content": ""},
                "done_reason": finish,
                "done": True,
                **self._metrics(req, content),
            }
        )
        return Answer(200, self.ndjson_type, [go_json(line) + b"\n" for line in lines], stream=True)

    async def generate(self, request, body):
        req = self.fake.model_request(self, request.path, body)
        if "stream" not in body:
            req.stream = True
        if self.resolve_model(req.model) is None:
            return self.failed(catalog.UNKNOWN_MODEL, True, model=req.model)
        reply = self.fake.next_reply(req)
        if reply.error is not None:
            return self.native_error(*reply.error)
        out = self.raw_text(reply)
        finish = reply.finish_reason or "stop"
        base = {"model": req.model}
        tail = {"done": True, "done_reason": finish}
        if not body.get("raw"):
            tail["context"] = [151644, 872, 198]
        if not req.stream:
            return self.native_json(
                200, {**base, "created_at": self._stamp(), "response": out, **tail, **self._metrics(req, out)}
            )
        lines = [{**base, "created_at": self._stamp(), "response": p, "done": False} for p in encoding.pieces(out)]
        lines.append({**base, "created_at": self._stamp(), "response": "", **tail, **self._metrics(req, out)})
        return Answer(200, self.ndjson_type, [go_json(line) + b"\n" for line in lines], stream=True)
