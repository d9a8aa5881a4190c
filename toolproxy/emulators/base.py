"""What every emulated stack shares: one answer's shape, the token counts, and the OpenAI-compatible base.

Each stack's module (ollama.py, llamacpp.py, ...) subclasses `Emulator` and overrides only what
that stack does differently; the facts that identify a stack (its texts, versions, models) come
from its `toolproxy.stacks.catalog` entry, the same data the fingerprint and the markers read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

import toolproxy.emulators.encoding as encoding
from toolproxy import wire
from toolproxy.emulators.encoding import ALNUM, SSE_DONE, compact, fragments, random_text, sse
from toolproxy.emulators.model import ModelRequest, ScriptedReply, ToolCall, args_compact, render_calls, text
from toolproxy.stacks import catalog

if TYPE_CHECKING:
    from toolproxy.emulators.server import FakeStack


@dataclass
class Answer:
    """Status, headers and body pieces; a streamed answer is a list of events written one by one."""

    status: int
    content_type: str
    events: list[bytes]
    stream: bool = False
    headers: dict[str, str] = field(default_factory=dict)


def usage_tokens(req: ModelRequest, out: str) -> tuple[int, int]:
    """Deterministic stand-ins for token counts (about four bytes a token, plus the end token).

    A stop string that cut the output was generated too, and so was text the stack's parser ate:
    both are counted though never delivered, as real stacks count them (llama-server: 3 tokens for
    an `Observation:` it cut; Ollama: the whole call it dropped)."""
    prompt = len(orjson.dumps(req.messages or req.prompt or "")) // 4 + 1
    completion = len((out + (req.stopped or "") + req.eaten).encode()) // 4 + 1
    return prompt, completion


def cut_at_stop(req: ModelRequest, text: str) -> str:
    """The model's output up to the first stop string the request asked for (which every stack
    honours the same way: generation ends there and the string itself is not returned); notes
    which one matched on `req`."""
    found = [(text.find(s), s) for s in req.stops if s in text]
    if not found:
        return text
    at, word = min(found)
    req.stopped = word
    return text[:at]


def as_chat(family: str, body: dict) -> dict:
    """A Responses or Messages body as the chat request a stack serving that API runs internally."""
    return wire.write_request(wire.CHAT, wire.read_request(family, body))


# Each stack's emulator class by stack name, filled as the stacks' modules define them.
EMULATORS: dict[str, type[Emulator]] = {}


class Emulator:
    """Behaviour shared by OpenAI-compatible servers; subclasses override what differs."""

    profile: catalog.Stack  # the stack's catalog entry: its names, texts, versions and models
    json_type = "application/json"
    sse_type = "text/event-stream; charset=utf-8"
    call_format = "hermes"
    dumps: Callable[[Any], bytes] = staticmethod(compact)  # whole JSON bodies
    event_dumps: Callable[[Any], bytes] = staticmethod(compact)  # the JSON inside one SSE event

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        EMULATORS[cls.profile.name] = cls

    def __init__(self, fake: FakeStack) -> None:
        self.fake = fake

    @property
    def name(self) -> str:
        return self.profile.name

    def failure(self, kind: str, **values: Any) -> Answer:
        """This stack's own answer for one of its catalogued failures, in its error format."""
        f = self.profile.failures[kind]
        return self.error(f.status, f.text(**values))

    def json(self, status: int, obj: Any) -> Answer:
        return Answer(status, self.json_type, [self.dumps(obj)])

    # -- routing
    def routes(self) -> list[tuple[str, str, Callable]]:
        return [
            ("POST", "/v1/chat/completions", self.chat),
            ("POST", "/v1/completions", self.completions),
            ("GET", "/v1/models", self.models),
        ]

    def websocket_routes(self) -> dict[str, Callable]:
        """Paths this stack upgrades to a WebSocket, and their handlers; every other upgrade request
        is answered as the plain HTTP request it also is (a stack that does not upgrade)."""
        return {}

    # -- errors
    def error(self, status: int, message: str, kind: str | None = None) -> Answer:
        raise NotImplementedError

    def not_found(self) -> Answer:
        """An unknown path (also how a stack without the Responses or Messages API answers them)."""
        return Answer(404, "text/plain; charset=utf-8", [b"Not Found"])

    def unknown_model(self, model: str) -> Answer | None:
        return None

    def refuse_tools(self, req: ModelRequest) -> Answer | None:
        return None

    def parses_calls(self, req: ModelRequest) -> bool:
        return True

    def constraint(self, body: dict) -> Any:
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") == "json_schema":
            return (rf.get("json_schema") or {}).get("schema", {})
        if isinstance(rf, dict) and rf.get("type") == "json_object":
            return {"type": "object"}
        return None

    def broken(self, req: ModelRequest, raw_text: str) -> Answer | ScriptedReply:
        """Default: the parser gives up and the whole raw text becomes content (vLLM hermes)."""
        return text(raw_text)

    # -- shared pipeline
    async def chat(self, request: web.Request, body: dict) -> Answer:
        out = self.converse(request.path, body)
        if isinstance(out, Answer):
            return out
        req, reply, content, native, finish = out
        if req.stream:
            return Answer(200, self.sse_type, self.chat_stream(req, content, native, finish, reply), stream=True)
        return self.json(200, self.chat_body(req, content, native, finish, reply))

    def converse(self, path: str, body: dict) -> Answer | tuple[ModelRequest, ScriptedReply, str, list[ToolCall], str]:
        """A chat request through this stack's checks, the model and its parser; an Answer when it errors."""
        req = self.fake.model_request(self, path, body)
        if (a := self.unknown_model(req.model)) is not None:
            return a
        if (a := self.refuse_tools(req)) is not None:
            return a
        out = self.model_output(req, self.error)
        if isinstance(out, Answer):
            return out
        reply, content, native = out
        return req, reply, content, native, reply.finish_reason or ("tool_calls" if native else "stop")

    def model_output(
        self, req: ModelRequest, error: Callable[[int, str], Answer]
    ) -> Answer | tuple[ScriptedReply, str, list]:
        """Run the scripted model, then this stack's parser; an Answer when the stack errors instead."""
        reply = self.fake.next_reply(req)
        if reply.error is not None:
            return error(*reply.error)
        if reply.broken is not None:
            outcome = self.broken(req, reply.broken)
            if isinstance(outcome, Answer):
                return outcome
            reply = outcome
        content, native = self.resolve(req, reply)
        if req.stops:
            cut = cut_at_stop(req, content)
            if req.stopped is not None:
                content, native = cut, []  # generation ended at the stop string: no call came after it
        return reply, content, native

    def raw_text(self, reply: ScriptedReply) -> str:
        """The model's output on raw-completion endpoints, where no tool parser runs."""
        if reply.broken is not None:
            return reply.broken
        return reply.content + (
            render_calls(self.fake.call_format or self.call_format, list(reply.calls)) if reply.calls else ""
        )

    def resolve(self, req: ModelRequest, reply: ScriptedReply) -> tuple[str, list[ToolCall]]:
        """(content, native calls) once this stack's parser has seen the model's output."""
        if not reply.calls:
            return reply.content, []
        if req.constraint is not None:
            # Constrained decoding forces the call into the schema's JSON, as text.
            c = reply.calls[0]
            return orjson.dumps({"name": c.name, "arguments": c.arguments}).decode(), []
        if req.tools and self.parses_calls(req):
            return reply.content, list(reply.calls)
        return reply.content + render_calls(self.fake.call_format or self.call_format, list(reply.calls)), []

    def usage(self, req: ModelRequest, out: str) -> dict:
        p, c = usage_tokens(req, out)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def call_id(self) -> str:
        return "call_" + random_text(ALNUM, 24)

    # how the server serialises parsed arguments into the `arguments` string
    args_dumps: Callable[[Any], str] = staticmethod(args_compact)

    def native_calls(self, cs: list[ToolCall]) -> list[dict]:
        return [
            {
                "id": self.call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": self.args_dumps(c.arguments)},
            }
            for c in cs
        ]

    def completion_id(self) -> str:
        return "chatcmpl-" + random_text(ALNUM, 29)

    def chat_body(self, req, content, native, finish, reply) -> dict:
        raise NotImplementedError

    def chat_stream(self, req, content, native, finish, reply) -> list[bytes]:
        """OpenAI-style SSE: role first, content pieces, tool-call deltas with argument fragments."""
        cid, created = self.completion_id(), int(time.time())
        events = []

        def chunk(delta: dict, finish_reason: str | None = None, out: str = "") -> bytes:
            return sse(self.chunk_obj(req, cid, created, delta, finish_reason, out), self.event_dumps)

        events.append(chunk(self.first_delta()))
        if reply.reasoning:
            events.extend(chunk({"reasoning_content": p}) for p in encoding.pieces(reply.reasoning))
        if content:
            events.extend(chunk({"content": p}) for p in encoding.pieces(content))
        for i, tc in enumerate(self.native_calls(native)):
            fn = tc["function"]
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": tc["id"],
                                "type": "function",
                                "function": {"name": fn["name"], "arguments": ""},
                            }
                        ]
                    }
                )
            )
            events.extend(
                chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for f in fragments(fn["arguments"])
            )
        out = content + "".join(c.name for c in native)  # what the token counts count
        events.append(chunk(self.last_delta(), finish, out))
        so = req.body.get("stream_options")
        if isinstance(so, dict) and so.get("include_usage"):
            events.append(sse(self.usage_chunk(req, cid, created, out), self.event_dumps))
        events.append(SSE_DONE)
        return events

    def first_delta(self) -> dict:
        return {"role": "assistant", "content": ""}

    def last_delta(self) -> dict:
        return {}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out="") -> dict:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def usage_chunk(self, req, cid, created, out) -> dict:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "choices": [],
            "usage": self.usage(req, out),
        }

    async def completions(self, request: web.Request, body: dict) -> Answer:
        req = self.fake.model_request(self, request.path, body)
        if (a := self.unknown_model(req.model)) is not None:
            return a
        reply = self.fake.next_reply(req)
        if reply.error is not None:
            return self.error(*reply.error)
        out = cut_at_stop(req, self.raw_text(reply))
        cid, created = "cmpl-" + random_text(ALNUM, 29), int(time.time())
        base = {"id": cid, "object": "text_completion", "created": created, "model": req.model}
        if req.stream:
            events = [
                sse(
                    {**base, "choices": [{"index": 0, "text": p, "logprobs": None, "finish_reason": None}]},
                    self.event_dumps,
                )
                for p in encoding.pieces(out)
            ]
            events.append(
                sse(
                    {
                        **base,
                        "choices": [
                            {"index": 0, "text": "", "logprobs": None, "finish_reason": reply.finish_reason or "stop"}
                        ],
                    },
                    self.event_dumps,
                )
            )
            events.append(SSE_DONE)
            return Answer(200, self.sse_type, events, stream=True)
        obj = {
            **base,
            "choices": [{"index": 0, "text": out, "logprobs": None, "finish_reason": reply.finish_reason or "stop"}],
            "usage": self.usage(req, out),
        }
        return self.json(200, obj)

    async def models(self, request: web.Request, body: dict) -> Answer:
        return self.json(200, {"object": "list", "data": [self.model_entry(m) for m in self.fake.models]})

    def model_entry(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": self.profile.owned_by}
