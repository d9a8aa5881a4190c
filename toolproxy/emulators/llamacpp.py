"""llama.cpp's llama-server: OpenAI chat, Responses and Messages endpoints, its native API and /props."""

from __future__ import annotations

import json
import time
from typing import Any

import orjson

import toolproxy.emulators.encoding as encoding
from toolproxy import wire
from toolproxy.emulators.base import Answer, Emulator, as_chat, cut_at_stop, usage_tokens
from toolproxy.emulators.encoding import ALNUM, compact, fragments, random_text, sse
from toolproxy.emulators.model import text
from toolproxy.stacks import catalog


class LlamaCpp(Emulator):
    """llama-server: tools/server/server.cpp, utils.hpp (format_error_response, oaicompat parsing)."""

    profile = catalog.LLAMACPP
    json_type = "application/json; charset=utf-8"
    sse_type = "text/event-stream"
    build = catalog.LLAMACPP.version

    def routes(self):
        return super().routes() + [
            ("POST", "/chat/completions", self.chat),
            ("POST", "/completion", self.native_completion),
            ("POST", "/completions", self.native_completion),
            ("POST", "/apply-template", self.apply_template),
            ("GET", "/props", self.props),
            ("GET", "/health", self.health),
            ("GET", "/v1/health", self.health),
            ("GET", "/models", self.models),
            ("POST", "/v1/responses", self.responses),
            ("POST", "/responses", self.responses),
            ("POST", "/v1/messages", self.messages),
            ("POST", "/v1/messages/count_tokens", self.count_tokens),
        ]

    def not_found(self) -> Answer:
        return self.json(404, {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}})

    # -- the Responses and Messages endpoints: llama-server turns each into a chat request, runs
    # it, and writes the result back in that protocol (shapes as captured from a real llama-server
    # in tests/data/wire; its Responses stream events carry no output_index / content_index).
    async def responses(self, request, body):
        # llama-server honours a `stop` field on its Responses endpoint too (captured), though the API has none
        chat = {**as_chat(wire.RESPONSES, body), **({"stop": body["stop"]} if "stop" in body else {})}
        out = self.converse(request.path, chat)
        if isinstance(out, Answer):
            return out
        req, reply, content, native, finish = out
        created, rid, mid = int(time.time()), "resp_" + random_text(ALNUM, 32), "msg_" + random_text(ALNUM, 32)
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": content}
        output: list[dict] = []
        if content:  # an empty reply has no output item at all (tests/data/wire/empty)
            output.append({"type": "message", "status": "completed", "id": mid, "content": [part], "role": "assistant"})
        calls = [
            {
                "type": "function_call",
                "status": "completed",
                "arguments": tc["function"]["arguments"],
                "call_id": tc["id"],
                "name": tc["function"]["name"],
                "id": "fc_" + tc["id"],
            }
            for tc in self.native_calls(native)
        ]
        output += calls
        p, c = usage_tokens(req, content)
        cached = self.fake.cached_tokens or 0
        usage = {
            "input_tokens": p,
            "output_tokens": c,
            "total_tokens": p + c,
            "input_tokens_details": {"cached_tokens": cached},
        }
        if not req.stream:
            return self.json(
                200,
                {
                    "completed_at": created,
                    "created_at": created,
                    "id": rid,
                    "model": req.model,
                    "object": "response",
                    "output": output,
                    "status": "completed",
                    "usage": usage,
                },
            )

        def event(kind: str, **data) -> bytes:
            return b"event: " + kind.encode() + b"\ndata: " + compact({"type": kind, **data}) + b"\n\n"

        head = {"id": rid, "object": "response", "status": "in_progress"}
        events = [event("response.created", response=head), event("response.in_progress", response=head)]
        if content:
            events.append(
                event(
                    "response.output_item.added",
                    item={"content": [], "id": mid, "role": "assistant", "status": "in_progress", "type": "message"},
                )
            )
            events.append(event("response.content_part.added", item_id=mid, part={"type": "output_text", "text": ""}))
            events += [
                event("response.output_text.delta", item_id=mid, delta=piece) for piece in encoding.pieces(content)
            ]
            events.append(event("response.output_text.done", item_id=mid, text=content))
            events.append(event("response.content_part.done", item_id=mid, part=part))
            events.append(event("response.output_item.done", item=output[0]))
        for item in calls:
            events.append(event("response.output_item.added", item={**item, "arguments": "", "status": "in_progress"}))
            events += [
                event("response.function_call_arguments.delta", item_id=item["id"], delta=f)
                for f in fragments(item["arguments"])
            ]
            events.append(
                event("response.function_call_arguments.done", item_id=item["id"], arguments=item["arguments"])
            )
            events.append(event("response.output_item.done", item=item))
        events.append(
            event(
                "response.completed",
                response={
                    **head,
                    "created_at": created,
                    "status": "completed",
                    "model": req.model,
                    "output": output,
                    "usage": usage,
                },
                timings=self.timings(req, content),
            )
        )
        return Answer(200, self.sse_type, events, stream=True)

    async def messages(self, request, body):
        out = self.converse(request.path, as_chat(wire.MESSAGES, body))
        if isinstance(out, Answer):
            return out
        req, reply, content, native, finish = out
        mid = self.completion_id()
        stop = "tool_use" if native else {"length": "max_tokens"}.get(finish, "end_turn")
        blocks: list[dict] = [{"type": "text", "text": content}] if content else []
        blocks += [
            {
                "type": "tool_use",
                "id": tc["id"],
                "name": tc["function"]["name"],
                "input": orjson.loads(tc["function"]["arguments"]),
            }
            for tc in self.native_calls(native)
        ]
        p, c = usage_tokens(req, content)
        cached = min(self.fake.cached_tokens or 0, p)
        usage = {"cache_read_input_tokens": cached, "input_tokens": p - cached, "output_tokens": c}
        # llama-server says end_turn after a stop string too, and names it in stop_sequence (as captured)
        message = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "content": blocks,
            "model": req.model,
            "stop_reason": stop,
            "stop_sequence": req.stopped,
            "usage": usage,
        }
        if not req.stream:
            return self.json(200, message)

        def event(kind: str, **data) -> bytes:
            return b"event: " + kind.encode() + b"\ndata: " + compact({"type": kind, **data}) + b"\n\n"

        events = [
            event(
                "message_start",
                message={**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}},
            )
        ]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                events.append(event("content_block_start", index=index, content_block={"type": "text", "text": ""}))
                events += [
                    event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
                    for piece in encoding.pieces(content)
                ]
            else:
                events.append(event("content_block_start", index=index, content_block={**block, "input": {}}))
                events += [
                    event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": f})
                    for f in fragments(orjson.dumps(block["input"]).decode())
                ]
            events.append(event("content_block_stop", index=index))
        events.append(
            event(
                "message_delta", delta={"stop_reason": stop, "stop_sequence": req.stopped}, usage={"output_tokens": c}
            )
        )
        events.append(event("message_stop"))
        return Answer(200, self.sse_type, events, stream=True)

    async def count_tokens(self, request, body):
        chat = wire.read_request(wire.MESSAGES, body)
        return self.json(200, {"input_tokens": len(orjson.dumps(chat.messages)) // 4 + 1})

    def error(self, status, message, kind=None):
        kind = kind or {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            501: "not_supported_error",
            503: "unavailable_error",
        }.get(status, "server_error")
        return self.json(status, {"error": {"code": status, "message": message, "type": kind}})

    def refuse_tools(self, req):
        if self.fake.jinja:
            return None
        if req.body.get("tools"):
            # Thrown while parsing the request, before any streaming starts: plain JSON even for stream:true.
            return self.failure(catalog.TOOL_REFUSAL)
        if req.body.get("tool_choice") not in (None,):
            return self.failure(catalog.TOOL_CHOICE_REFUSAL)
        return None

    def parses_calls(self, req):
        return self.fake.jinja

    def constraint(self, body):
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") in ("json_schema", "json_object"):
            return rf.get("schema") or (rf.get("json_schema") or {}).get("schema") or {"type": "object"}
        return body.get("json_schema") or body.get("grammar")

    def broken(self, req, raw_text):
        if not (self.fake.jinja and req.tools):
            return text(raw_text)
        pos = max(0, min((raw_text.find(m) for m in ("<tool_call>", "{", "[") if m in raw_text), default=0))
        return self.failure(catalog.PARSE_FAILURE, pos=pos, rest=raw_text[pos:])

    def call_id(self):
        return random_text(ALNUM, 32)

    def completion_id(self):
        return "chatcmpl-" + random_text(ALNUM, 32)

    def timings(self, req, out) -> dict:
        p, c = usage_tokens(req, out)
        return {
            "cache_n": self.fake.cached_tokens or 0,
            "prompt_n": p,
            "prompt_ms": 12.5,
            "prompt_per_token_ms": 12.5 / p,
            "prompt_per_second": p / 0.0125,
            "predicted_n": c,
            "predicted_ms": 40.0,
            "predicted_per_token_ms": 40.0 / c,
            "predicted_per_second": c / 0.04,
        }

    def usage(self, req, out):
        u = super().usage(req, out)
        u["prompt_tokens_details"] = {"cached_tokens": self.fake.cached_tokens or 0}
        return u

    def chat_body(self, req, content, native, finish, reply):
        msg: dict[str, Any] = {"role": "assistant", "content": None if native and not content else content}
        if reply.reasoning:
            msg["reasoning_content"] = reply.reasoning
        if native:
            msg["tool_calls"] = self.native_calls(native)
        return {
            "choices": [{"finish_reason": finish, "index": 0, "message": msg}],
            "created": int(time.time()),
            "model": req.model,
            "system_fingerprint": self.build,
            "object": "chat.completion",
            "usage": self.usage(req, content),
            "id": self.completion_id(),
            "timings": self.timings(req, content),
        }

    def first_delta(self):
        return {"role": "assistant", "content": None}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        obj = {
            "choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}],
            "created": created,
            "id": cid,
            "model": req.model,
            "system_fingerprint": self.build,
            "object": "chat.completion.chunk",
        }
        if finish_reason is not None:
            obj["timings"] = self.timings(req, out)  # on the last chunk, usage block asked for or not
        return obj

    def usage_chunk(self, req, cid, created, out):
        return {
            "choices": [],
            "created": created,
            "id": cid,
            "model": req.model,
            "system_fingerprint": self.build,
            "object": "chat.completion.chunk",
            "usage": self.usage(req, out),
            "timings": self.timings(req, out),
        }

    def model_entry(self, name):
        return {
            "id": name,
            "object": "model",
            "created": self.fake.created,
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": 2,
                "n_vocab": 151936,
                "n_ctx_train": self.fake.context_length,
                "n_embd": 896,
                "n_params": 494032768,
                "size": 1273807104,
            },
        }

    async def models(self, request, body):
        return self.json(
            200,
            {
                "models": [
                    {
                        "name": m,
                        "model": m,
                        "modified_at": "",
                        "size": "",
                        "digest": "",
                        "type": "model",
                        "description": "",
                        "tags": [""],
                        "capabilities": ["completion"],
                        "parameters": "",
                        "details": {
                            "parent_model": "",
                            "format": "gguf",
                            "family": "",
                            "families": [""],
                            "parameter_size": "",
                            "quantization_level": "",
                        },
                    }
                    for m in self.fake.models
                ],
                "object": "list",
                "data": [self.model_entry(m) for m in self.fake.models],
            },
        )

    async def props(self, request, body):
        # As the real server (tests/data/llamacpp/props_*.json): --no-jinja still reports the GGUF's
        # template and its caps, so /props alone cannot tell that launch from a --jinja one.
        return self.json(
            200,
            {
                "default_generation_settings": {
                    "params": {
                        "seed": 4294967295,
                        "temperature": 0.8,
                        "top_k": 40,
                        "top_p": 0.95,
                        "max_tokens": -1,
                        "n_predict": -1,
                    },
                    "n_ctx": self.fake.context_length,
                },
                "total_slots": 1,
                "model_alias": self._model_path(),
                "model_ftype": "Q4_K - Medium",
                "model_path": self._model_path(),
                "modalities": {"vision": False, "video": False, "audio": False},
                "media_marker": f"<__media_{random_text(ALNUM, 32)}__>",
                "endpoint_slots": True,
                "endpoint_props": False,
                "endpoint_metrics": False,
                "ui": True,
                "ui_settings": {},
                "chat_template": self.profile.chat_template,
                "chat_template_caps": {
                    "supports_object_arguments": True,
                    "supports_parallel_tool_calls": True,
                    "supports_preserve_reasoning": False,
                    "supports_reasoning_effort": False,
                    "supports_string_content": True,
                    "supports_system_role": True,
                    "supports_tool_calls": True,
                    "supports_tools": True,
                    "supports_typed_content": False,
                },
                "bos_token": "<|endoftext|>",
                "eos_token": "<|im_end|>",
                "build_info": self.build,
                "is_sleeping": False,
                "cors_proxy_enabled": False,
            },
        )

    def _model_path(self) -> str:
        return f"/models/{self.fake.model.removesuffix('.gguf')}.gguf"

    async def health(self, request, body):
        if self.fake.loading:
            return self.error(503, "Loading model")
        return self.json(200, {"status": "ok"})

    async def apply_template(self, request, body):
        # Same request parsing as chat (oaicompat_chat_params_parse): tools need --jinja, and with it
        # the Hermes template renders each tool with tojson into the system turn.
        tools = body.get("tools") or []
        if tools and not self.fake.jinja:
            return self.failure(catalog.TOOL_REFUSAL)
        msgs = body.get("messages") or []
        prompt = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content') or ''}<|im_end|>\n" for m in msgs)
        if tools:
            block = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            prompt = (
                f"<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
                f"query.\n\n<tools>\n{block}\n</tools><|im_end|>\n"
            ) + prompt
        return self.json(200, {"prompt": prompt + "<|im_start|>assistant\n"})

    async def native_completion(self, request, body):
        req = self.fake.model_request(self, request.path, body)
        reply = self.fake.next_reply(req)
        if reply.error is not None:
            return self.error(*reply.error)
        out = cut_at_stop(req, self.raw_text(reply))
        p, c = usage_tokens(req, out)
        final = {
            "index": 0,
            "content": "" if req.stream else out,
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": req.model,
            "tokens_predicted": c,
            "tokens_evaluated": p,
            "generation_settings": {"n_predict": -1, "temperature": 0.8},
            "prompt": req.prompt or "",
            "has_new_line": "\n" in out,
            "truncated": False,
            "stop_type": "word" if req.stopped else "eos",
            "stopping_word": req.stopped or "",
            "tokens_cached": (self.fake.cached_tokens or 0) + p,
            "timings": self.timings(req, out),
        }
        if not req.stream:
            return self.json(200, final)
        events = [
            sse(
                {
                    "index": 0,
                    "content": piece,
                    "tokens": [],
                    "stop": False,
                    "id_slot": -1,
                    "tokens_predicted": i + 1,
                    "tokens_evaluated": p,
                }
            )
            for i, piece in enumerate(encoding.pieces(out))
        ]
        events.append(sse(final))
        return Answer(200, self.sse_type, events, stream=True)
