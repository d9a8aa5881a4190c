"""api.openai.com, the reference shape every OpenAI-compatible server copies."""

from __future__ import annotations

import time

import orjson
from aiohttp import web

import toolproxy.emulators.encoding as encoding
from toolproxy import wire
from toolproxy.emulators.base import Answer, Emulator, as_chat
from toolproxy.emulators.encoding import pretty_json
from toolproxy.stacks import catalog


class OpenAI(Emulator):
    """api.openai.com: the reference shape. Non-streamed bodies are pretty-printed (2 spaces)."""

    profile = catalog.OPENAI

    dumps = staticmethod(pretty_json)

    def error(self, status, message, kind=None, code=None):
        kind = kind or {
            400: "invalid_request_error",
            401: "invalid_request_error",
            404: "invalid_request_error",
            429: "rate_limit_exceeded",
        }.get(status, "server_error")
        return self.json(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})

    def unknown_model(self, model):
        if model in self.fake.models:
            return None
        f = self.profile.failures[catalog.UNKNOWN_MODEL]
        return self.error(f.status, f.text(model=model), code="model_not_found")

    def chat_body(self, req, content, native, finish, reply):
        msg = {"role": "assistant", "content": None if native else content, "refusal": None, "annotations": []}
        if native:
            msg["tool_calls"] = self.native_calls(native)
        usage = self.usage(req, content)
        usage["prompt_tokens_details"] = {"cached_tokens": self.fake.cached_tokens or 0, "audio_tokens": 0}
        usage["completion_tokens_details"] = {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        }
        return {
            "id": self.completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
            "service_tier": "default",
            "system_fingerprint": self.profile.system_fingerprint,
        }

    def first_delta(self):
        return {"role": "assistant", "content": "", "refusal": None}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        obj = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "service_tier": "default",
            "system_fingerprint": self.profile.system_fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        so = req.body.get("stream_options")
        if isinstance(so, dict) and so.get("include_usage"):
            obj["usage"] = None
        return obj

    def usage_chunk(self, req, cid, created, out):
        usage = self.usage(req, out)
        usage["prompt_tokens_details"] = {"cached_tokens": self.fake.cached_tokens or 0, "audio_tokens": 0}
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "service_tier": "default",
            "system_fingerprint": self.profile.system_fingerprint,
            "choices": [],
            "usage": usage,
        }

    def model_entry(self, name):
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": "system"}

    def routes(self):
        return super().routes() + [("POST", "/v1/responses", self.responses)]

    def not_found(self) -> Answer:
        return self.error(404, "Invalid URL")

    def websocket_routes(self):
        return {"/v1/responses": self.responses_socket}

    async def responses_socket(self, request, seen):
        """Responses over a WebSocket (OpenAI's WebSocket mode, https://developers.openai.com/api/
        reference/resources/responses/websocket-events): each `response.create` text message is a
        Responses request (its fields those of POST /v1/responses, `stream` implicit); the answer
        is the stream's events, each its own text message, ending with `response.completed` (or
        `error`). `generate: false` asks for no output (Codex's prewarm): the response completes
        empty. A `previous_response_id` names a response made earlier on the same connection (the
        mode keeps the last ones in the connection's memory, `store: false` or not): its input and
        output come before the new input. permessage-deflate is agreed when the client offers it,
        as the API does."""
        ws = web.WebSocketResponse(compress=True)
        await ws.prepare(request)
        earlier: dict[str, list] = {}  # response id -> the conversation up to and with its output
        async for msg in ws:
            if msg.type != web.WSMsgType.TEXT:
                continue
            seen(msg.data.encode())
            try:
                body = orjson.loads(msg.data)
            except orjson.JSONDecodeError as exc:
                await ws.send_str(orjson.dumps({"type": "error", "error": {"message": str(exc)}}).decode())
                continue
            if not isinstance(body, dict) or body.get("type") != "response.create":
                continue
            create = {k: v for k, v in body.items() if k not in ("type", "previous_response_id")}
            items = create.get("input") if isinstance(create.get("input"), list) else []
            if isinstance(create.get("input"), str):
                items = [{"role": "user", "content": create["input"]}]
            previous = body.get("previous_response_id")
            if previous is not None and previous not in earlier:
                error = {"code": "previous_response_not_found", "message": f"Previous response {previous} not found."}
                await ws.send_str(orjson.dumps({"type": "error", "status": 400, "error": error}).decode())
                continue
            items = [*earlier.get(previous, []), *items]
            for event in await self.response_events(request.path, {**create, "input": items, "stream": True}, body):
                done = orjson.loads(event)
                if done.get("type") == "response.completed":
                    response = done["response"]
                    earlier[response["id"]] = [*items, *response.get("output", [])]
                await ws.send_str(event.decode())
        return ws

    async def response_events(self, path: str, body: dict, message: dict) -> list[bytes]:
        """The JSON of each event a streamed response sends (or of its error)."""
        if message.get("generate") is False:
            encoder = wire.encoder_for(wire.RESPONSES, body, True)
            raw = encoder.end("", [], "stop", {"prompt_tokens": 0, "completion_tokens": 0})
        else:
            answer = await self.responses_answer(path, body)
            raw = b"".join(answer.events)
            if answer.status != 200:
                error = {"type": "error", "status": answer.status, "error": orjson.loads(raw).get("error")}
                return [orjson.dumps(error)]
        return [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]

    async def responses(self, request, body):
        """The Responses API in the reference shape (toolproxy.wire's encoder writes it)."""
        return await self.responses_answer(request.path, body)

    async def responses_answer(self, path, body):
        out = self.converse(path, as_chat(wire.RESPONSES, body))
        if isinstance(out, Answer):
            return out
        req, reply, content, native, finish = out
        encoder = wire.encoder_for(wire.RESPONSES, body, req.stream)
        calls = [
            wire.Call(i, tc["id"], tc["function"]["name"], tc["function"]["arguments"])
            for i, tc in enumerate(self.native_calls(native))
        ]
        usage = self.usage(req, content)
        usage["prompt_tokens_details"] = {"cached_tokens": self.fake.cached_tokens or 0}
        raw = b"".join(encoder.delta(p) for p in encoding.pieces(content)) if content else b""
        raw += encoder.end("", calls, finish, usage)
        if not req.stream:
            return self.json(200, orjson.loads(raw))
        return Answer(200, self.sse_type, [e + b"\n\n" for e in raw.split(b"\n\n") if e], stream=True)
