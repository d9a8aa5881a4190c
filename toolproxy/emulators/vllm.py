"""vLLM's OpenAI-compatible server (FastAPI), with its Anthropic Messages endpoint."""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

import toolproxy.emulators.encoding as encoding
from toolproxy import wire
from toolproxy.emulators.base import Answer, Emulator, as_chat
from toolproxy.emulators.encoding import compact, fragments
from toolproxy.emulators.model import args_text
from toolproxy.stacks import catalog


class VLLM(Emulator):
    """vLLM (FastAPI): vllm/entrypoints/openai/serving_chat.py, protocol.py ErrorResponse."""

    profile = catalog.VLLM
    args_dumps = staticmethod(args_text)  # the tool parsers re-dump with json.dumps(ensure_ascii=False)
    version = catalog.VLLM.version

    def routes(self):
        return super().routes() + [
            ("GET", "/version", self.version_route),
            ("GET", "/health", self.health),
            ("POST", "/v1/messages", self.messages),
            ("POST", "/v1/messages/count_tokens", self.count_tokens),
        ]

    async def version_route(self, request, body):
        return self.json(200, {"version": self.version})

    async def health(self, request, body):
        return Answer(200, "", [b""])

    def not_found(self) -> Answer:
        return self.json(404, {"detail": "Not Found"})  # FastAPI's default

    # -- /v1/messages: vllm/entrypoints/anthropic (api_router.py, serving.py, protocol.py): the
    # request becomes a chat completion and the reply is converted back. Non-streamed:
    # model_dump(exclude_none), a text block only when there is text. Streamed: the chat stream's
    # chunks turned into events dumped with exclude_unset, so message_start's message carries no
    # `type`/`role` but explicit null stop fields and its usage.
    _STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

    def anthropic_error(self, answer: Answer) -> Answer:
        err = orjson.loads(b"".join(answer.events)).get("error") or {}
        return self.json(
            answer.status, {"type": "error", "error": {"type": err.get("type"), "message": err.get("message")}}
        )

    async def messages(self, request, body):
        out = self.converse(request.path, as_chat(wire.MESSAGES, body))
        if isinstance(out, Answer):
            return self.anthropic_error(out)
        req, reply, content, native, finish = out
        usage = self.usage(req, content)
        tokens = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}
        calls = self.native_calls(native)
        cid = self.completion_id()
        if not req.stream:
            blocks = [{"type": "text", "text": content}] if content else []
            blocks += [
                {
                    "type": "tool_use",
                    "id": tc["id"],
                    "name": tc["function"]["name"],
                    "input": orjson.loads(tc["function"]["arguments"]),
                }
                for tc in calls
            ]
            message = {"id": cid, "type": "message", "role": "assistant", "content": blocks, "model": req.model}
            if finish in self._STOP:
                message["stop_reason"] = "stop_sequence" if req.stopped else self._STOP[finish]
                message["stop_sequence"] = req.stopped
            return self.json(200, {**message, "usage": tokens})

        def event(kind: str, **data) -> bytes:
            return b"event: " + kind.encode() + b"\ndata: " + compact({"type": kind, **data}) + b"\n\n"

        events = [
            event(
                "message_start",
                message={
                    "id": cid,
                    "content": [],
                    "model": req.model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": tokens["input_tokens"], "output_tokens": 0},
                },
            )
        ]
        index, started = 0, False
        for piece in encoding.pieces(content) if content else ():
            if not started:
                events.append(event("content_block_start", content_block={"type": "text", "text": ""}, index=index))
                started = True
            events.append(event("content_block_delta", delta={"type": "text_delta", "text": piece}, index=index))
        for tc in calls:
            if started:
                events.append(event("content_block_stop", index=index))
                index += 1
            events.append(
                event(
                    "content_block_start",
                    content_block={"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"], "input": {}},
                    index=index,
                )
            )
            started = True
            events += [
                event("content_block_delta", delta={"type": "input_json_delta", "partial_json": f}, index=index)
                for f in fragments(tc["function"]["arguments"])
            ]
        if started:
            events.append(event("content_block_stop", index=index))
        events.append(
            event(
                "message_delta",
                delta={
                    "stop_reason": "stop_sequence" if req.stopped else self._STOP.get(finish, "end_turn"),
                    "stop_sequence": req.stopped,
                },
                usage=tokens,
            )
        )
        events.append(event("message_stop"))
        return Answer(200, self.sse_type, events, stream=True)

    async def count_tokens(self, request, body):
        chat = wire.read_request(wire.MESSAGES, body)
        n = len(orjson.dumps(chat.messages)) // 4 + 1
        return self.json(200, {"input_tokens": n, "context_management": {"original_input_tokens": n}})

    def error(self, status, message, kind=None):
        kind = kind or {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        return self.json(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    def unknown_model(self, model):
        if model in self.fake.models:
            return None
        return self.failure(catalog.UNKNOWN_MODEL, model=model)

    def tool_choice(self, body: dict) -> Any:
        if "tool_choice" in body and body["tool_choice"] is not None:
            return body["tool_choice"]
        return "auto" if body.get("tools") is not None else "none"

    def refuse_tools(self, req):
        if self.tool_choice(req.body) == "auto" and not self.fake.tool_parser:
            return self.failure(catalog.TOOL_REFUSAL)
        return None

    def parses_calls(self, req):
        choice = self.tool_choice(req.body)
        if choice == "none":
            return False
        # "required" and named choices are met by guided decoding, parser or not.
        return bool(self.fake.tool_parser) or choice == "required" or isinstance(choice, dict)

    def constraint(self, body):
        so = body.get("structured_outputs")
        if isinstance(so, dict) and so.get("json") is not None:
            return so["json"]
        return super().constraint(body)  # guided_json & co. are accepted and silently ignored

    def call_id(self):
        return "chatcmpl-tool-" + secrets.token_hex(16)

    def completion_id(self):
        return "chatcmpl-" + secrets.token_hex(16)

    def chat_body(self, req, content, native, finish, reply):
        msg = {
            "role": "assistant",
            "reasoning_content": reply.reasoning,
            "content": None if native and not content else content,
            "tool_calls": self.native_calls(native),
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
                {"index": 0, "message": msg, "logprobs": None, "finish_reason": finish, "stop_reason": req.stopped}
            ],
            "usage": usage,
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }

    def last_delta(self):
        return {"content": ""}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = req.stopped  # the stop string that matched; None for the end token
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "choices": [choice],
        }

    def model_entry(self, name):
        return {
            "id": name,
            "object": "model",
            "created": self.fake.created,
            "owned_by": "vllm",
            "root": name,
            "parent": None,
            "max_model_len": self.fake.context_length,
            "permission": [
                {
                    "id": "modelperm-" + secrets.token_hex(16),
                    "object": "model_permission",
                    "created": self.fake.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
