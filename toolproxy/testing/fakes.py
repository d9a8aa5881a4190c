"""Emulated serving stacks: aiohttp apps that answer on the wire the way each real stack does.

Real stacks cannot run in CI, yet what toolproxy measures is exactly how they differ: who refuses
`tools` with a 400, who leaves a call in `content`, whose error body is flat or nested, who streams
NDJSON instead of SSE. Each fake reproduces one stack's observable behaviour (status, body bytes,
Content-Type, framing, metadata endpoints) as read from its source (references beside each
builder); the *model* behind it is a script the test writes.

Three layers, kept apart so a test can vary one without the others:

* the model: `Reply` values (`text`, `call`, `calls`, `text_call`, `broken_call`, `error`) queued
  with `FakeStack.enqueue` or produced by a responder callable given a `ModelRequest`;
* the stack: `STACKS[name]` turns a Reply into that stack's bytes (refusals, parser presence,
  chunk shapes, error format);
* faults: `Fault` values (stall, close mid-stream, raw bodies, gzip, N failures) that disturb the
  transport, for the proxy's own tests.

Run one from a test with `async with FakeStack("ollama").running() as url` (or `.in_thread()` for
sync clients), or from a shell: `python -m toolproxy.testing.fakes ollama --port 0`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip as gzip_mod
import json
import re
import secrets
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import orjson
from aiohttp import web
from multidict import CIMultiDict

from toolproxy import wire
from toolproxy.stacks.fingerprint import USER_AGENT_PREFIX

NAMES = ("ollama", "vllm", "sglang", "llamacpp", "lmstudio", "openai")

# ---------------------------------------------------------------- the model's side: replies


@dataclass(frozen=True)
class ToolCall:
    """One call as the model meant it. `arguments` may be a str to script malformed JSON."""

    name: str
    arguments: Any = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """What the model produced for one request.

    `calls` are calls in the format the stack's parser expects: a stack with a parser returns them
    as native `tool_calls`, one without leaves them in `content` as text (see FakeStack.call_format).
    `broken` is call-shaped text the stack's parser chokes on. `error` makes the stack answer with
    its own error format instead of running the model.
    """

    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    finish_reason: str | None = None
    broken: str | None = None
    error: tuple[int, str] | None = None


def text(content: str, *, reasoning: str | None = None, finish_reason: str | None = None) -> Reply:
    """Plain text, returned verbatim as `content` by every stack (never parsed)."""
    return Reply(content=content, reasoning=reasoning, finish_reason=finish_reason)


def call(name: str, arguments: Any = None, *, content: str = "") -> Reply:
    """One well-formed call in the model's trained format."""
    return Reply(content=content, calls=(ToolCall(name, {} if arguments is None else arguments),))


def calls(*items: ToolCall | tuple[str, Any], content: str = "") -> Reply:
    """Parallel calls: `calls(("a", {...}), ("b", {...}))`."""
    return Reply(content=content, calls=tuple(c if isinstance(c, ToolCall) else ToolCall(*c) for c in items))


def text_call(fmt: str, name: str, arguments: Any = None, *, before: str = "", after: str = "") -> Reply:
    """Text that holds a call in some format (see CALL_FORMATS); no stack parses it."""
    return text(before + render_calls(fmt, [ToolCall(name, {} if arguments is None else arguments)]) + after)


def broken_call(raw: str) -> Reply:
    """Call-shaped output the stack's parser fails on (llama.cpp 500, Ollama 500, others: text)."""
    return Reply(broken=raw)


def error(status: int, message: str) -> Reply:
    """The stack answers `status` in its own error format (e.g. out of memory, context too long)."""
    return Reply(error=(status, message))


def _args_text(arguments: Any) -> str:
    """Arguments as a model writes them in text (Python-json spacing), or verbatim when scripted as str."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _args_compact(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


def _pythonic_value(v: Any) -> str:
    return repr(v) if not isinstance(v, (dict, list, bool)) or isinstance(v, bool) else orjson.dumps(v).decode()


CALL_FORMATS: dict[str, Callable[[list[ToolCall]], str]] = {
    "hermes": lambda cs: "\n".join(
        '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (c.name, _args_text(c.arguments)) for c in cs
    ),
    "llama3": lambda cs: "; ".join('{"name": "%s", "parameters": %s}' % (c.name, _args_text(c.arguments)) for c in cs),
    "mistral": lambda cs: "[TOOL_CALLS]["
    + ", ".join('{"name": "%s", "arguments": %s}' % (c.name, _args_text(c.arguments)) for c in cs)
    + "]",
    "pythonic": lambda cs: "["
    + ", ".join(
        f"{c.name}(" + ", ".join(f"{k}={_pythonic_value(v)}" for k, v in (c.arguments or {}).items()) + ")" for c in cs
    )
    + "]",
    "lmstudio": lambda cs: "".join(
        '[TOOL_REQUEST]{"name": "%s", "arguments": %s}[END_TOOL_REQUEST]' % (c.name, _args_text(c.arguments))
        for c in cs
    ),
    "fenced": lambda cs: "\n".join(
        '```json\n{"name": "%s", "arguments": %s}\n```' % (c.name, _args_text(c.arguments)) for c in cs
    ),
    "json": lambda cs: "\n".join('{"name": "%s", "arguments": %s}' % (c.name, _args_text(c.arguments)) for c in cs),
}


def render_calls(fmt: str, cs: list[ToolCall]) -> str:
    try:
        return CALL_FORMATS[fmt](cs)
    except KeyError:
        raise ValueError(f"unknown call format {fmt!r}; choose one of {', '.join(CALL_FORMATS)}") from None


@dataclass
class ModelRequest:
    """What a responder sees: the parsed request, whatever endpoint it came through."""

    stack: str
    path: str
    model: str
    body: dict
    messages: list
    tools: list[str]
    stream: bool
    prompt: str | None = None
    constraint: Any = None
    stops: list[str] = field(default_factory=list)  # the stop strings the request asked for
    # Set by the stack when one of them cut the model's output: the string that matched.
    stopped: str | None = None
    # What the model generated that the stack's parser consumed and returned nothing for.
    eaten: str = ""


DEFAULT_REPLY = text("Hello! How can I help you today?")

# ---------------------------------------------------------------- transport faults


@dataclass
class Fault:
    """A disturbance for the next `times` matching requests (None: every request).

    status/body replace the whole answer (raw bytes, sent as given: non-UTF-8, non-JSON...);
    close_after drops the connection after that many stream events (or body bytes when not
    streaming); stall_before delays the status line; stall_between delays every event; gzip
    compresses the body with Content-Encoding: gzip; headers are added to the answer (repeats kept).
    """

    times: int | None = 1
    path: str | None = None
    status: int | None = None
    body: bytes | None = None
    content_type: str = "application/json"
    stall_before: float = 0.0
    stall_between: float = 0.0
    close_after: int | None = None
    gzip: bool = False
    headers: tuple[tuple[str, str], ...] = ()


def stall(before: float = 0.0, between: float = 0.0, times: int | None = 1, path: str | None = None) -> Fault:
    return Fault(times=times, path=path, stall_before=before, stall_between=between)


def close_mid_stream(after: int = 2, times: int | None = 1, path: str | None = None) -> Fault:
    return Fault(times=times, path=path, close_after=after)


def raw(body: bytes, status: int = 200, content_type: str = "application/json", times: int | None = 1,
        path: str | None = None) -> Fault:
    return Fault(times=times, path=path, status=status, body=body, content_type=content_type)


def gzipped(times: int | None = 1, path: str | None = None) -> Fault:
    return Fault(times=times, path=path, gzip=True)


@dataclass
class Seen:
    """One request as the fake received it, and how its answer ended."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    header_list: list[tuple[str, str]]
    body: bytes
    outcome: str = "pending"  # complete | disconnected | cut (a close_mid_stream fault)
    raw_path: str = ""  # the request target as received (percent-encoding intact)
    status: int | None = None
    sent: bytes = b""  # the response body bytes written so far, as on the wire (after gzip)

    def json(self) -> Any:
        return orjson.loads(self.body)


# ---------------------------------------------------------------- one answer, stack-neutral


@dataclass
class Answer:
    """Status, headers and body pieces; a streamed answer is a list of events written one by one."""

    status: int
    content_type: str
    events: list[bytes]
    stream: bool = False
    headers: dict[str, str] = field(default_factory=dict)


def compact(obj: Any) -> bytes:
    """Python servers (FastAPI/starlette, pydantic) and nlohmann::json: no spaces, UTF-8 as is."""
    return orjson.dumps(obj)


def go_json(obj: Any) -> bytes:
    """Go's encoding/json: compact and HTML-safe (<, >, & escaped), as Ollama writes it."""
    return (
        orjson.dumps(obj)
        .replace(b"<", b"\\u003c")
        .replace(b">", b"\\u003e")
        .replace(b"&", b"\\u0026")
        .replace("\u2028".encode(), b"\\u2028")
        .replace("\u2029".encode(), b"\\u2029")
    )


def go_numbers(value: Any) -> Any:
    """Ollama decodes arguments into Go values and re-marshals them: 3.0 comes back as 3."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: go_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [go_numbers(v) for v in value]
    return value


def go_encoder(obj: Any) -> bytes:
    """Go's json.NewEncoder(w).Encode: go_json plus a newline."""
    return go_json(obj) + b"\n"


def pretty_json(obj: Any) -> bytes:
    """api.openai.com and LM Studio pretty-print non-streamed bodies (2-space indent)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2)


def sse(obj: Any, dumps: Callable[[Any], bytes] = compact) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def _pieces(s: str) -> list[str]:
    """Split text into token-sized pieces (a word and its trailing space), as stacks stream it."""
    return re.findall(r"\S+\s*|\s+", s) or [""]


def _fragments(s: str, n: int = 3) -> list[str]:
    """Argument JSON cut into n fragments, as OpenAI and vLLM stream it."""
    step = max(1, -(-len(s) // n))
    return [s[i : i + step] for i in range(0, len(s), step)] or [""]


def _rand(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_LOWER = "abcdefghijklmnopqrstuvwxyz0123456789"


def _usage_tokens(req: ModelRequest, out: str) -> tuple[int, int]:
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


# ---------------------------------------------------------------- the stacks


def as_chat(family: str, body: dict) -> dict:
    """A Responses or Messages body as the chat request a stack serving that API runs internally."""
    return wire.write_request(wire.CHAT, wire.read_request(family, body))


class Stack:
    """Behaviour shared by OpenAI-compatible servers; subclasses override what differs."""

    name = ""
    server_header: str | None = None
    json_type = "application/json"
    sse_type = "text/event-stream; charset=utf-8"
    call_format = "hermes"
    dumps: Callable[[Any], bytes] = staticmethod(compact)  # whole JSON bodies
    event_dumps: Callable[[Any], bytes] = staticmethod(compact)  # the JSON inside one SSE event

    def __init__(self, fake: "FakeStack") -> None:
        self.fake = fake

    def json(self, status: int, obj: Any) -> Answer:
        return Answer(status, self.json_type, [self.dumps(obj)])

    # -- routing
    def routes(self) -> list[tuple[str, str, Callable]]:
        return [
            ("POST", "/v1/chat/completions", self.chat),
            ("POST", "/v1/completions", self.completions),
            ("GET", "/v1/models", self.models),
        ]

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

    def broken(self, req: ModelRequest, raw_text: str) -> Answer | Reply:
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

    def converse(self, path: str, body: dict) -> Answer | tuple[ModelRequest, Reply, str, list[ToolCall], str]:
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

    def model_output(self, req: ModelRequest, error: Callable[[int, str], Answer]) -> Answer | tuple[Reply, str, list]:
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

    def raw_text(self, reply: Reply) -> str:
        """The model's output on raw-completion endpoints, where no tool parser runs."""
        if reply.broken is not None:
            return reply.broken
        return reply.content + (render_calls(self.fake.call_format or self.call_format, list(reply.calls)) if reply.calls else "")

    def resolve(self, req: ModelRequest, reply: Reply) -> tuple[str, list[ToolCall]]:
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
        p, c = _usage_tokens(req, out)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def call_id(self) -> str:
        return "call_" + _rand(_ALNUM, 24)

    # how the server serialises parsed arguments into the `arguments` string
    args_dumps: Callable[[Any], str] = staticmethod(_args_compact)

    def native_calls(self, cs: list[ToolCall]) -> list[dict]:
        return [
            {"id": self.call_id(), "type": "function", "function": {"name": c.name, "arguments": self.args_dumps(c.arguments)}}
            for c in cs
        ]

    def completion_id(self) -> str:
        return "chatcmpl-" + _rand(_ALNUM, 29)

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
            events.extend(chunk({"reasoning_content": p}) for p in _pieces(reply.reasoning))
        if content:
            events.extend(chunk({"content": p}) for p in _pieces(content))
        for i, tc in enumerate(self.native_calls(native)):
            fn = tc["function"]
            events.append(chunk({"tool_calls": [{"index": i, "id": tc["id"], "type": "function",
                                                 "function": {"name": fn["name"], "arguments": ""}}]}))
            events.extend(chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]})
                          for f in _fragments(fn["arguments"]))
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
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

    def usage_chunk(self, req, cid, created, out) -> dict:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                "choices": [], "usage": self.usage(req, out)}

    async def completions(self, request: web.Request, body: dict) -> Answer:
        req = self.fake.model_request(self, request.path, body)
        if (a := self.unknown_model(req.model)) is not None:
            return a
        reply = self.fake.next_reply(req)
        if reply.error is not None:
            return self.error(*reply.error)
        out = cut_at_stop(req, self.raw_text(reply))
        cid, created = "cmpl-" + _rand(_ALNUM, 29), int(time.time())
        base = {"id": cid, "object": "text_completion", "created": created, "model": req.model}
        if req.stream:
            events = [sse({**base, "choices": [{"index": 0, "text": p, "logprobs": None, "finish_reason": None}]},
                          self.event_dumps) for p in _pieces(out)]
            events.append(sse({**base, "choices": [{"index": 0, "text": "", "logprobs": None,
                                                    "finish_reason": reply.finish_reason or "stop"}]}, self.event_dumps))
            events.append(SSE_DONE)
            return Answer(200, self.sse_type, events, stream=True)
        obj = {**base, "choices": [{"index": 0, "text": out, "logprobs": None,
                                    "finish_reason": reply.finish_reason or "stop"}], "usage": self.usage(req, out)}
        return self.json(200, obj)

    async def models(self, request: web.Request, body: dict) -> Answer:
        return self.json(200, {"object": "list", "data": [self.model_entry(m) for m in self.fake.models]})

    def model_entry(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": self.name}


class OpenAI(Stack):
    """api.openai.com: the reference shape. Non-streamed bodies are pretty-printed (2 spaces)."""

    name = "openai"
    fingerprint = "fp_" + "f33640a400"

    dumps = staticmethod(pretty_json)

    def error(self, status, message, kind=None, code=None):
        kind = kind or {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                        429: "rate_limit_exceeded"}.get(status, "server_error")
        return self.json(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})

    def unknown_model(self, model):
        if model in self.fake.models:
            return None
        return self.error(404, f"The model `{model}` does not exist or you do not have access to it.",
                          code="model_not_found")

    def chat_body(self, req, content, native, finish, reply):
        msg = {"role": "assistant", "content": None if native else content, "refusal": None, "annotations": []}
        if native:
            msg["tool_calls"] = self.native_calls(native)
        usage = self.usage(req, content)
        usage["prompt_tokens_details"] = {"cached_tokens": self.fake.cached_tokens or 0, "audio_tokens": 0}
        usage["completion_tokens_details"] = {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
        return {"id": self.completion_id(), "object": "chat.completion", "created": int(time.time()),
                "model": req.model, "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
                "usage": usage, "service_tier": "default", "system_fingerprint": self.fingerprint}

    def first_delta(self):
        return {"role": "assistant", "content": "", "refusal": None}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
               "service_tier": "default", "system_fingerprint": self.fingerprint,
               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        so = req.body.get("stream_options")
        if isinstance(so, dict) and so.get("include_usage"):
            obj["usage"] = None
        return obj

    def usage_chunk(self, req, cid, created, out):
        usage = self.usage(req, out)
        usage["prompt_tokens_details"] = {"cached_tokens": self.fake.cached_tokens or 0, "audio_tokens": 0}
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                "service_tier": "default", "system_fingerprint": self.fingerprint, "choices": [], "usage": usage}

    def model_entry(self, name):
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": "system"}

    def routes(self):
        return super().routes() + [("POST", "/v1/responses", self.responses)]

    def not_found(self) -> Answer:
        return self.error(404, "Invalid URL")

    async def responses(self, request, body):
        """The Responses API in the reference shape (toolproxy.wire's encoder writes it)."""
        out = self.converse(request.path, as_chat(wire.RESPONSES, body))
        if isinstance(out, Answer):
            return out
        req, reply, content, native, finish = out
        encoder = wire.encoder_for(wire.RESPONSES, body, req.stream)
        calls = [wire.Call(i, tc["id"], tc["function"]["name"], tc["function"]["arguments"])
                 for i, tc in enumerate(self.native_calls(native))]
        usage = self.usage(req, content)
        usage["prompt_tokens_details"] = {"cached_tokens": self.fake.cached_tokens or 0}
        raw = b"".join(encoder.delta(p) for p in _pieces(content)) if content else b""
        raw += encoder.end("", calls, finish, usage)
        if not req.stream:
            return self.json(200, orjson.loads(raw))
        return Answer(200, self.sse_type, [e + b"\n\n" for e in raw.split(b"\n\n") if e], stream=True)


class VLLM(Stack):
    """vLLM (FastAPI): vllm/entrypoints/openai/serving_chat.py, protocol.py ErrorResponse."""

    name = "vllm"
    server_header = "uvicorn"
    args_dumps = staticmethod(_args_text)  # the tool parsers re-dump with json.dumps(ensure_ascii=False)
    version = "0.11.0"

    def routes(self):
        return super().routes() + [
            ("GET", "/version", self.version_route), ("GET", "/health", self.health),
            ("POST", "/v1/messages", self.messages), ("POST", "/v1/messages/count_tokens", self.count_tokens),
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
        return self.json(answer.status, {"type": "error", "error": {"type": err.get("type"), "message": err.get("message")}})

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
            blocks += [{"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                        "input": orjson.loads(tc["function"]["arguments"])} for tc in calls]
            message = {"id": cid, "type": "message", "role": "assistant", "content": blocks, "model": req.model}
            if finish in self._STOP:
                message["stop_reason"] = "stop_sequence" if req.stopped else self._STOP[finish]
                message["stop_sequence"] = req.stopped
            return self.json(200, {**message, "usage": tokens})

        def event(kind: str, **data) -> bytes:
            return b"event: " + kind.encode() + b"\ndata: " + compact({"type": kind, **data}) + b"\n\n"

        events = [event("message_start", message={"id": cid, "content": [], "model": req.model, "stop_reason": None,
                                                  "stop_sequence": None,
                                                  "usage": {"input_tokens": tokens["input_tokens"], "output_tokens": 0}})]
        index, started = 0, False
        for piece in _pieces(content) if content else ():
            if not started:
                events.append(event("content_block_start", content_block={"type": "text", "text": ""}, index=index))
                started = True
            events.append(event("content_block_delta", delta={"type": "text_delta", "text": piece}, index=index))
        for tc in calls:
            if started:
                events.append(event("content_block_stop", index=index))
                index += 1
            events.append(event("content_block_start", content_block={
                "type": "tool_use", "id": tc["id"], "name": tc["function"]["name"], "input": {}}, index=index))
            started = True
            events += [event("content_block_delta", delta={"type": "input_json_delta", "partial_json": f}, index=index)
                       for f in _fragments(tc["function"]["arguments"])]
        if started:
            events.append(event("content_block_stop", index=index))
        events.append(event("message_delta", delta={"stop_reason": "stop_sequence" if req.stopped else self._STOP.get(finish, "end_turn"),
                                                   "stop_sequence": req.stopped}, usage=tokens))
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
        return self.error(404, f"The model `{model}` does not exist.")

    def tool_choice(self, body: dict) -> Any:
        if "tool_choice" in body and body["tool_choice"] is not None:
            return body["tool_choice"]
        return "auto" if body.get("tools") is not None else "none"

    def refuse_tools(self, req):
        if self.tool_choice(req.body) == "auto" and not self.fake.tool_parser:
            return self.error(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
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
        msg = {"role": "assistant", "reasoning_content": reply.reasoning, "content": None if native and not content else content,
               "tool_calls": self.native_calls(native)}
        usage = self.usage(req, content)
        usage["prompt_tokens_details"] = None if self.fake.cached_tokens is None else {"cached_tokens": self.fake.cached_tokens}
        return {"id": self.completion_id(), "object": "chat.completion", "created": int(time.time()), "model": req.model,
                "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish,
                             "stop_reason": req.stopped}],
                "usage": usage, "prompt_logprobs": None, "kv_transfer_params": None}

    def last_delta(self):
        return {"content": ""}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = req.stopped  # the stop string that matched; None for the end token
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model, "choices": [choice]}

    def model_entry(self, name):
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": "vllm", "root": name,
                "parent": None, "max_model_len": self.fake.context_length,
                "permission": [{"id": "modelperm-" + secrets.token_hex(16), "object": "model_permission",
                                "created": self.fake.created, "allow_create_engine": False, "allow_sampling": True,
                                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}]}


class SGLang(VLLM):
    """SGLang (FastAPI): python/sglang/srt/entrypoints/openai/serving_chat.py; flat ErrorResponse."""

    name = "sglang"
    version = "0.5.4"

    def routes(self):
        return Stack.routes(self) + [
            ("GET", "/health", self.health), ("GET", "/get_model_info", self.model_info),
            ("GET", "/get_server_info", self.server_info), ("GET", "/server_info", self.server_info),
        ]

    async def model_info(self, request, body):
        return self.json(200, {"model_path": self.fake.model, "tokenizer_path": self.fake.model, "is_generation": True,
                                  "preferred_sampling_params": None, "weight_version": "default",
                                  "has_image_understanding": False, "has_audio_understanding": False,
                                  "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})

    async def server_info(self, request, body):
        return self.json(200, {"model_path": self.fake.model, "served_model_name": self.fake.model, "host": "127.0.0.1",
                                  "tool_call_parser": self.fake.tool_parser, "reasoning_parser": None,
                                  "chat_template": None, "context_length": self.fake.context_length,
                                  "enable_cache_report": self.fake.cached_tokens is not None,
                                  "version": self.version})

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
        msg = {"role": "assistant", "content": None if native and not content else content,
               "reasoning_content": reply.reasoning, "tool_calls": self.native_calls(native) or None}
        usage = self.usage(req, content)
        usage["prompt_tokens_details"] = None if self.fake.cached_tokens is None else {"cached_tokens": self.fake.cached_tokens}
        return {"id": self.completion_id(), "object": "chat.completion", "created": int(time.time()), "model": req.model,
                "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish,
                             "matched_stop": self.matched(req, finish)}],
                "usage": usage, "metadata": {"weight_version": "default"}}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["matched_stop"] = self.matched(req, finish_reason)
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                "choices": [choice], "usage": None}

    def matched(self, req, finish):
        """matched_stop: the stop string that ended generation, or the id of the end token (Qwen's <|im_end|>)."""
        return req.stopped if req.stopped is not None else 151645 if finish == "stop" else None

    def model_entry(self, name):
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": "sglang", "root": name,
                "max_model_len": self.fake.context_length}


HERMES_JINJA = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{{- \"# Tools\\n\\nYou may call one or more functions to assist "
    "with the user query.\\n\\n<tools>\" }}{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags\" }}{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + message.role "
    "+ '\\n' + (message.content or '') + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class LlamaCpp(Stack):
    """llama-server: tools/server/server.cpp, utils.hpp (format_error_response, oaicompat parsing)."""

    name = "llamacpp"
    server_header = "llama.cpp"
    json_type = "application/json; charset=utf-8"
    sse_type = "text/event-stream"
    build = "b6500-3f4b1c2d"

    def routes(self):
        return super().routes() + [
            ("POST", "/chat/completions", self.chat), ("POST", "/completion", self.native_completion),
            ("POST", "/completions", self.native_completion), ("POST", "/apply-template", self.apply_template),
            ("GET", "/props", self.props), ("GET", "/health", self.health), ("GET", "/v1/health", self.health),
            ("GET", "/models", self.models), ("POST", "/v1/responses", self.responses), ("POST", "/responses", self.responses),
            ("POST", "/v1/messages", self.messages), ("POST", "/v1/messages/count_tokens", self.count_tokens),
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
        created, rid, mid = int(time.time()), "resp_" + _rand(_ALNUM, 32), "msg_" + _rand(_ALNUM, 32)
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": content}
        output: list[dict] = []
        if content:  # an empty reply has no output item at all (tests/data/wire/empty)
            output.append({"type": "message", "status": "completed", "id": mid, "content": [part], "role": "assistant"})
        calls = [{"type": "function_call", "status": "completed", "arguments": tc["function"]["arguments"],
                  "call_id": tc["id"], "name": tc["function"]["name"], "id": "fc_" + tc["id"]} for tc in self.native_calls(native)]
        output += calls
        p, c = _usage_tokens(req, content)
        cached = self.fake.cached_tokens or 0
        usage = {"input_tokens": p, "output_tokens": c, "total_tokens": p + c, "input_tokens_details": {"cached_tokens": cached}}
        if not req.stream:
            return self.json(200, {"completed_at": created, "created_at": created, "id": rid, "model": req.model,
                                   "object": "response", "output": output, "status": "completed", "usage": usage})

        def event(kind: str, **data) -> bytes:
            return b"event: " + kind.encode() + b"\ndata: " + compact({"type": kind, **data}) + b"\n\n"

        head = {"id": rid, "object": "response", "status": "in_progress"}
        events = [event("response.created", response=head), event("response.in_progress", response=head)]
        if content:
            events.append(event("response.output_item.added", item={"content": [], "id": mid, "role": "assistant",
                                                                   "status": "in_progress", "type": "message"}))
            events.append(event("response.content_part.added", item_id=mid, part={"type": "output_text", "text": ""}))
            events += [event("response.output_text.delta", item_id=mid, delta=piece) for piece in _pieces(content)]
            events.append(event("response.output_text.done", item_id=mid, text=content))
            events.append(event("response.content_part.done", item_id=mid, part=part))
            events.append(event("response.output_item.done", item=output[0]))
        for item in calls:
            events.append(event("response.output_item.added", item={**item, "arguments": "", "status": "in_progress"}))
            events += [event("response.function_call_arguments.delta", item_id=item["id"], delta=f)
                       for f in _fragments(item["arguments"])]
            events.append(event("response.function_call_arguments.done", item_id=item["id"], arguments=item["arguments"]))
            events.append(event("response.output_item.done", item=item))
        events.append(event("response.completed", response={**head, "created_at": created, "status": "completed",
                                                             "model": req.model, "output": output, "usage": usage},
                            timings=self.timings(req, content)))
        return Answer(200, self.sse_type, events, stream=True)

    async def messages(self, request, body):
        out = self.converse(request.path, as_chat(wire.MESSAGES, body))
        if isinstance(out, Answer):
            return out
        req, reply, content, native, finish = out
        mid = self.completion_id()
        stop = "tool_use" if native else {"length": "max_tokens"}.get(finish, "end_turn")
        blocks: list[dict] = [{"type": "text", "text": content}] if content else []
        blocks += [{"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                    "input": orjson.loads(tc["function"]["arguments"])} for tc in self.native_calls(native)]
        p, c = _usage_tokens(req, content)
        cached = min(self.fake.cached_tokens or 0, p)
        usage = {"cache_read_input_tokens": cached, "input_tokens": p - cached, "output_tokens": c}
        # llama-server says end_turn after a stop string too, and names it in stop_sequence (as captured)
        message = {"id": mid, "type": "message", "role": "assistant", "content": blocks, "model": req.model,
                   "stop_reason": stop, "stop_sequence": req.stopped, "usage": usage}
        if not req.stream:
            return self.json(200, message)

        def event(kind: str, **data) -> bytes:
            return b"event: " + kind.encode() + b"\ndata: " + compact({"type": kind, **data}) + b"\n\n"

        events = [event("message_start", message={**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}})]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                events.append(event("content_block_start", index=index, content_block={"type": "text", "text": ""}))
                events += [event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
                           for piece in _pieces(content)]
            else:
                events.append(event("content_block_start", index=index, content_block={**block, "input": {}}))
                events += [event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": f})
                           for f in _fragments(orjson.dumps(block["input"]).decode())]
            events.append(event("content_block_stop", index=index))
        events.append(event("message_delta", delta={"stop_reason": stop, "stop_sequence": req.stopped}, usage={"output_tokens": c}))
        events.append(event("message_stop"))
        return Answer(200, self.sse_type, events, stream=True)

    async def count_tokens(self, request, body):
        chat = wire.read_request(wire.MESSAGES, body)
        return self.json(200, {"input_tokens": len(orjson.dumps(chat.messages)) // 4 + 1})

    def error(self, status, message, kind=None):
        kind = kind or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                        501: "not_supported_error", 503: "unavailable_error"}.get(status, "server_error")
        return self.json(status, {"error": {"code": status, "message": message, "type": kind}})

    def refuse_tools(self, req):
        if self.fake.jinja:
            return None
        if req.body.get("tools"):
            # Thrown while parsing the request, before any streaming starts: plain JSON even for stream:true.
            return self.error(500, "tools param requires --jinja flag")
        if req.body.get("tool_choice") not in (None,):
            return self.error(500, "Unsupported param: tool_choice")
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
        return self.error(500, f"Failed to parse input at pos {pos}: {raw_text[pos:]}")

    def call_id(self):
        return _rand(_ALNUM, 32)

    def completion_id(self):
        return "chatcmpl-" + _rand(_ALNUM, 32)

    def timings(self, req, out) -> dict:
        p, c = _usage_tokens(req, out)
        return {"cache_n": self.fake.cached_tokens or 0, "prompt_n": p, "prompt_ms": 12.5,
                "prompt_per_token_ms": 12.5 / p, "prompt_per_second": p / 0.0125, "predicted_n": c,
                "predicted_ms": 40.0, "predicted_per_token_ms": 40.0 / c, "predicted_per_second": c / 0.04}

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
        return {"choices": [{"finish_reason": finish, "index": 0, "message": msg}], "created": int(time.time()),
                "model": req.model, "system_fingerprint": self.build, "object": "chat.completion",
                "usage": self.usage(req, content), "id": self.completion_id(), "timings": self.timings(req, content)}

    def first_delta(self):
        return {"role": "assistant", "content": None}

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        obj = {"choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}], "created": created, "id": cid,
               "model": req.model, "system_fingerprint": self.build, "object": "chat.completion.chunk"}
        if finish_reason is not None:
            obj["timings"] = self.timings(req, out)  # on the last chunk, usage block asked for or not
        return obj

    def usage_chunk(self, req, cid, created, out):
        return {"choices": [], "created": created, "id": cid, "model": req.model, "system_fingerprint": self.build,
                "object": "chat.completion.chunk", "usage": self.usage(req, out), "timings": self.timings(req, out)}

    def model_entry(self, name):
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": "llamacpp",
                "meta": {"vocab_type": 2, "n_vocab": 151936, "n_ctx_train": self.fake.context_length, "n_embd": 896,
                         "n_params": 494032768, "size": 1273807104}}

    async def models(self, request, body):
        return self.json(200, {"models": [{"name": m, "model": m, "modified_at": "", "size": "", "digest": "",
                                              "type": "model", "description": "", "tags": [""],
                                              "capabilities": ["completion"], "parameters": "",
                                              "details": {"parent_model": "", "format": "gguf", "family": "",
                                                          "families": [""], "parameter_size": "",
                                                          "quantization_level": ""}} for m in self.fake.models],
                                  "object": "list", "data": [self.model_entry(m) for m in self.fake.models]})

    async def props(self, request, body):
        return self.json(200, {
            "default_generation_settings": {"n_ctx": self.fake.context_length, "params": {"temperature": 0.8}},
            "total_slots": 1, "model_path": f"/models/{self.fake.model}.gguf", "modalities": {"vision": False, "audio": False},
            "chat_template": HERMES_JINJA if self.fake.jinja else "",
            "chat_template_caps": {"supports_tools": True, "supports_tool_calls": True, "supports_parallel_tool_calls": True,
                                   "supports_system_role": True, "supports_tool_responses": True,
                                   "supports_object_arguments": False, "supports_string_content": True,
                                   "supports_typed_content": False},
            "bos_token": "", "eos_token": "<|im_end|>", "build_info": self.build, "webui": True,
        })

    async def health(self, request, body):
        if self.fake.loading:
            return self.error(503, "Loading model")
        return self.json(200, {"status": "ok"})

    async def apply_template(self, request, body):
        # Same request parsing as chat (oaicompat_chat_params_parse): tools need --jinja, and with it
        # the Hermes template renders each tool with tojson into the system turn.
        tools = body.get("tools") or []
        if tools and not self.fake.jinja:
            return self.error(500, "tools param requires --jinja flag")
        msgs = body.get("messages") or []
        prompt = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content') or ''}<|im_end|>\n" for m in msgs)
        if tools:
            block = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            prompt = (f"<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
                      f"query.\n\n<tools>\n{block}\n</tools><|im_end|>\n") + prompt
        return self.json(200, {"prompt": prompt + "<|im_start|>assistant\n"})

    async def native_completion(self, request, body):
        req = self.fake.model_request(self, request.path, body)
        reply = self.fake.next_reply(req)
        if reply.error is not None:
            return self.error(*reply.error)
        out = cut_at_stop(req, self.raw_text(reply))
        p, c = _usage_tokens(req, out)
        final = {"index": 0, "content": "" if req.stream else out, "tokens": [], "id_slot": 0, "stop": True,
                 "model": req.model, "tokens_predicted": c, "tokens_evaluated": p,
                 "generation_settings": {"n_predict": -1, "temperature": 0.8}, "prompt": req.prompt or "",
                 "has_new_line": "\n" in out, "truncated": False, "stop_type": "word" if req.stopped else "eos",
                 "stopping_word": req.stopped or "",
                 "tokens_cached": (self.fake.cached_tokens or 0) + p, "timings": self.timings(req, out)}
        if not req.stream:
            return self.json(200, final)
        events = [sse({"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": -1, "tokens_predicted": i + 1,
                       "tokens_evaluated": p}) for i, piece in enumerate(_pieces(out))]
        events.append(sse(final))
        return Answer(200, self.sse_type, events, stream=True)


class LMStudio(Stack):
    """LM Studio: no refusal; models not trained for tools answer with [TOOL_REQUEST] text."""

    name = "lmstudio"
    json_type = "application/json; charset=utf-8"
    call_format = "lmstudio"

    def routes(self):
        return super().routes() + [("GET", "/api/v1/models", self.native_models), ("GET", "/api/v0/models", self.native_models)]

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
        return {"id": "chatcmpl-" + _rand(_LOWER, 20), "object": "chat.completion", "created": int(time.time()),
                "model": req.model, "choices": [{"index": 0, "logprobs": None, "finish_reason": finish, "message": msg}],
                "usage": self.usage(req, content), "stats": {}, "system_fingerprint": req.model}

    def call_id(self):
        return "".join(secrets.choice("0123456789") for _ in range(9))

    def chunk_obj(self, req, cid, created, delta, finish_reason, out=""):
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                "system_fingerprint": req.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

    def model_entry(self, name):
        return {"id": name, "object": "model", "owned_by": "organization_owner"}

    async def native_models(self, request, body):
        return self.json(200, {"models": [{
            "type": "llm", "publisher": "lmstudio-community", "key": m, "display_name": m,
            "architecture": "qwen2", "quantization": {"name": "Q4_K_M", "bits_per_weight": 4},
            "size_bytes": 4683073952, "params_string": "7B", "loaded_instances": [],
            "max_context_length": self.fake.context_length, "format": "gguf",
            "capabilities": {"vision": False, "trained_for_tool_use": "tools" in self.fake.capabilities_of(m)},
        } for m in self.fake.models]})


OLLAMA_TEMPLATE = (
    "{{- if .Messages }}{{- if or .System .Tools }}<|im_start|>system\n{{- if .System }}\n{{ .System }}{{- end }}"
    "{{- if .Tools }}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>"
    "{{- range .Tools }}\n{\"type\": \"function\", \"function\": {{ .Function }}}{{- end }}\n</tools>\n\nFor each "
    "function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags"
    "{{- end }}<|im_end|>\n{{ end }}{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n{{ else }}{{ .Prompt }}{{ end }}"
)


class Ollama(Stack):
    """Ollama (Go, gin): server/routes.go, server/images.go CheckCapabilities, openai/openai.go."""

    name = "ollama"
    # /v1 routes: the openai middleware sets "application/json" itself and uses json.Encoder
    # (a trailing newline); native routes: gin's c.JSON (charset, no newline).
    json_type = "application/json"
    native_type = "application/json; charset=utf-8"
    sse_type = "text/event-stream"
    ndjson_type = "application/x-ndjson"
    dumps = staticmethod(go_encoder)
    event_dumps = staticmethod(go_json)
    version = "0.12.6"

    def routes(self):
        return super().routes() + [
            ("GET", "/", self.root), ("HEAD", "/", self.root), ("GET", "/api/version", self.version_route),
            ("GET", "/api/tags", self.tags), ("POST", "/api/show", self.show), ("POST", "/api/chat", self.native_chat),
            ("POST", "/api/generate", self.generate), ("GET", "/api/ps", self.ps),
        ]

    def native_json(self, status: int, obj: Any) -> Answer:
        return Answer(status, self.native_type, [go_json(obj)])

    def not_found(self) -> Answer:
        return Answer(404, "text/plain", [b"404 page not found"])  # gin's default

    async def root(self, request, body):
        return Answer(200, "text/plain; charset=utf-8", [b"Ollama is running"])

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

    def _missing(self, model):
        return f'model "{model}" not found, try pulling it first'

    def unknown_model(self, model):
        return None if self.resolve_model(model) else self.error(404, self._missing(model))

    def _refusal(self, req: ModelRequest) -> str | None:
        if req.body.get("tools") and "tools" not in self.fake.capabilities_of(self.resolve_model(req.model) or req.model):
            return f"{self.full_name(req.model)} does not support tools"
        return None

    def refuse_tools(self, req):
        msg = self._refusal(req)
        return None if msg is None else self.error(400, msg)

    def constraint(self, body):
        if "format" in body and body["format"] not in (None, ""):
            return body["format"]
        return super().constraint(body)

    def broken(self, req, raw_text):
        if req.tools:
            return self.error(500, "failed to parse JSON: unexpected end of JSON input") if req.path.startswith("/v1") \
                else self.native_error(500, "failed to parse JSON: unexpected end of JSON input")
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
        return "call_" + _rand(_LOWER, 8)

    def completion_id(self):
        return f"chatcmpl-{secrets.randbelow(999)}"

    def native_calls(self, cs):
        return [{"id": self.call_id(), "index": i, "type": "function",
                 "function": {"name": c.name, "arguments": _args_compact(c.arguments)}} for i, c in enumerate(cs)]

    def chat_body(self, req, content, native, finish, reply):
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reply.reasoning:
            msg["reasoning"] = reply.reasoning
        if native:
            msg["tool_calls"] = self.native_calls(native)
        return {"id": self.completion_id(), "object": "chat.completion", "created": int(time.time()), "model": req.model,
                "system_fingerprint": "fp_ollama", "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                "usage": self.usage(req, content)}

    def chat_stream(self, req, content, native, finish, reply):
        """Ollama /v1: content pieces, each tool call whole in one chunk, finish_reason on its own."""
        cid, created = self.completion_id(), int(time.time())

        def chunk(delta, finish_reason=None):
            return sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                        "system_fingerprint": "fp_ollama",
                        "choices": [{"index": 0, "delta": {"role": "assistant", **delta}, "finish_reason": finish_reason}]},
                       go_json)

        events = [chunk({"content": p}) for p in _pieces(content)] if content else []
        if native:
            events.append(chunk({"content": "", "tool_calls": self.native_calls(native)}))
        events.append(chunk({"content": ""}, finish))
        so = req.body.get("stream_options")
        if isinstance(so, dict) and so.get("include_usage"):
            events.append(sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                               "system_fingerprint": "fp_ollama", "choices": [], "usage": self.usage(req, content)}, go_json))
        events.append(SSE_DONE)
        return events

    def model_entry(self, name):
        return {"id": name, "object": "model", "created": self.fake.created, "owned_by": "library"}

    # -- native API
    def _stamp(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % 1_000_000_000:09d}Z"

    def _metrics(self, req: ModelRequest, out: str) -> dict:
        p, c = _usage_tokens(req, out)
        return {"total_duration": 512345678, "load_duration": 12345678, "prompt_eval_count": p,
                "prompt_eval_duration": 123456789, "eval_count": c, "eval_duration": 345678901}

    def _details(self, model: str) -> dict:
        return {"parent_model": "", "format": "gguf", "family": "qwen2", "families": ["qwen2"],
                "parameter_size": "7.6B", "quantization_level": "Q4_K_M"}

    async def tags(self, request, body):
        return self.native_json(200, {"models": [{"name": m, "model": m, "modified_at": "2025-09-01T10:00:00.000000000Z",
                                              "size": 4683087332, "digest": secrets.token_hex(32),
                                              "details": self._details(m)} for m in self.fake.models]})

    async def ps(self, request, body):
        return self.native_json(200, {"models": []})

    async def show(self, request, body):
        name = body.get("model") or body.get("name") or ""
        model = self.resolve_model(name)
        if model is None:
            return self.native_error(404, f"model '{name}' not found")
        return self.native_json(200, {
            "license": "Apache License 2.0", "modelfile": f"FROM {model}\nTEMPLATE \"\"\"{OLLAMA_TEMPLATE}\"\"\"\n",
            "parameters": 'stop                           "<|im_start|>"\nstop                           "<|im_end|>"',
            "template": OLLAMA_TEMPLATE if "tools" in self.fake.capabilities_of(model) else "{{ .Prompt }}",
            "details": self._details(model),
            "model_info": {"general.architecture": "qwen2", "general.parameter_count": 7615616512,
                           "qwen2.context_length": self.fake.context_length},
            "capabilities": list(self.fake.capabilities_of(model)), "modified_at": "2025-09-01T10:00:00.000000000Z",
        })

    async def native_chat(self, request, body):
        req = self.fake.model_request(self, request.path, body)
        if "stream" not in body:
            req.stream = True  # Ollama's native API streams unless told not to
        model = self.resolve_model(req.model)
        if model is None:
            return self.native_error(404, self._missing(req.model))
        if (msg := self._refusal(req)) is not None:
            return self.native_error(400, msg)
        out = self.model_output(req, self.native_error)
        if isinstance(out, Answer):
            return out
        reply, content, native = out
        tool_calls = [{"id": self.call_id(), "function": {"index": i, "name": c.name,
                                                           "arguments": c.arguments if isinstance(c.arguments, dict) else {}}}
                      for i, c in enumerate(native)]
        finish = reply.finish_reason or "stop"
        base = {"model": req.model}
        if not req.stream:
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if reply.reasoning:
                msg["thinking"] = reply.reasoning
            if tool_calls:
                msg["tool_calls"] = tool_calls
            return self.native_json(200, {**base, "created_at": self._stamp(), "message": msg, "done_reason": finish,
                                      "done": True, **self._metrics(req, content)})
        lines = []
        if reply.reasoning:
            lines += [{**base, "created_at": self._stamp(), "message": {"role": "assistant", "content": "", "thinking": p},
                       "done": False} for p in _pieces(reply.reasoning)]
        if content:
            lines += [{**base, "created_at": self._stamp(), "message": {"role": "assistant", "content": p}, "done": False}
                      for p in _pieces(content)]
        if tool_calls:
            lines.append({**base, "created_at": self._stamp(),
                          "message": {"role": "assistant", "content": "", "tool_calls": tool_calls}, "done": False})
        lines.append({**base, "created_at": self._stamp(), "message": {"role": "assistant", "content": ""},
                      "done_reason": finish, "done": True, **self._metrics(req, content)})
        return Answer(200, self.ndjson_type, [go_json(line) + b"\n" for line in lines], stream=True)

    async def generate(self, request, body):
        req = self.fake.model_request(self, request.path, body)
        if "stream" not in body:
            req.stream = True
        if self.resolve_model(req.model) is None:
            return self.native_error(404, self._missing(req.model))
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
            return self.native_json(200, {**base, "created_at": self._stamp(), "response": out, **tail,
                                      **self._metrics(req, out)})
        lines = [{**base, "created_at": self._stamp(), "response": p, "done": False} for p in _pieces(out)]
        lines.append({**base, "created_at": self._stamp(), "response": "", **tail, **self._metrics(req, out)})
        return Answer(200, self.ndjson_type, [go_json(line) + b"\n" for line in lines], stream=True)


STACKS: dict[str, type[Stack]] = {
    "ollama": Ollama, "vllm": VLLM, "sglang": SGLang, "llamacpp": LlamaCpp, "lmstudio": LMStudio, "openai": OpenAI,
}

DEFAULT_MODELS = {
    "ollama": {"qwen2.5:7b": ("completion", "tools"), "gemma3:latest": ("completion", "vision")},
    "vllm": {"Qwen/Qwen2.5-7B-Instruct": ("completion", "tools")},
    "sglang": {"Qwen/Qwen2.5-7B-Instruct": ("completion", "tools")},
    "llamacpp": {"qwen2.5-7b-instruct-q4_k_m.gguf": ("completion", "tools")},
    "lmstudio": {"qwen2.5-7b-instruct": ("completion", "tools"), "google/gemma-3-4b": ("completion",)},
    "openai": {"gpt-4o-mini": ("completion", "tools"), "gpt-4.1": ("completion", "tools")},
}

# ---------------------------------------------------------------- the server


class FakeStack:
    """One emulated stack. Options mirror the real launch flags:

    tool_parser: vLLM/SGLang `--tool-call-parser` (None: vLLM refuses auto tools, SGLang leaves calls
    in content); jinja: llama.cpp `--jinja` (default on; False gives the no_jinja variant);
    models: {name: capabilities} (Ollama refuses tools for models without "tools", LM Studio uses
    it for trained_for_tool_use); call_format: how unparsed calls look in content; cached_tokens:
    the cache report; loading: llama.cpp /health answers 503; prefix: the API is mounted under this
    path, as hosted ones are (https://openrouter.ai/api/v1/..., https://api.groq.com/openai/v1/...),
    and anything outside it is a 404.
    """

    def __init__(self, stack: str, *, models: dict[str, tuple[str, ...]] | None = None, tool_parser: str | None = None,
                 jinja: bool = True, call_format: str | None = None, cached_tokens: int | None = None,
                 context_length: int = 32768, replies: list[Reply] | None = None,
                 responder: Callable[[ModelRequest], Reply | None] | None = None, prefix: str = "") -> None:
        if stack == "no_jinja":
            stack, jinja = "llamacpp", False
        if stack not in STACKS:
            raise ValueError(f"unknown stack {stack!r}; choose one of {', '.join(NAMES)} (or no_jinja)")
        self.kind = stack
        self.model_caps = dict(models if models is not None else DEFAULT_MODELS[stack])
        self.models = list(self.model_caps)
        self.model = self.models[0]
        self.tool_parser = tool_parser
        self.jinja = jinja
        self.call_format = call_format
        self.cached_tokens = cached_tokens
        self.context_length = context_length
        self.loading = False
        self.created = int(time.time())
        self.replies: deque[Reply] = deque(replies or ())
        self.responder = responder
        self.prefix = prefix.rstrip("/")
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self.probes: list[Seen] = []
        self.disconnected = threading.Event()
        self.stack = STACKS[stack](self)
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    # -- scripting
    def enqueue(self, *replies: Reply) -> "FakeStack":
        self.replies.extend(replies)
        return self

    def inject(self, *faults: Fault) -> "FakeStack":
        self.faults.extend(faults)
        return self

    def fail(self, times: int = 1, status: int = 500, message: str = "llama runner process has terminated: exit status 2",
             path: str | None = None) -> "FakeStack":
        """Answer `times` requests with this stack's own error body, then behave again."""
        answer = self.stack.error(status, message)
        return self.inject(Fault(times=times, path=path, status=status, body=answer.events[0],
                                 content_type=answer.content_type))

    def capabilities_of(self, model: str) -> tuple[str, ...]:
        return tuple(self.model_caps.get(model, ()))

    def model_request(self, stack: Stack, path: str, body: dict) -> ModelRequest:
        tools = [t.get("function", t).get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)]
        return ModelRequest(stack=stack.name, path=path, model=str(body.get("model") or self.model), body=body,
                            messages=list(body.get("messages") or []), tools=tools, stream=bool(body.get("stream")),
                            prompt=body.get("prompt"), constraint=stack.constraint(body), stops=wire.stop_strings(body))

    def next_reply(self, req: ModelRequest) -> Reply:
        if self.replies:
            return self.replies.popleft()
        if self.responder is not None:
            reply = self.responder(req)
            if reply is not None:
                return reply
        return DEFAULT_REPLY

    # -- serving
    def _take_fault(self, path: str) -> Fault | None:
        for f in self.faults:
            if (f.path is None or path.startswith(f.path)) and (f.times is None or f.times > 0):
                if f.times is not None:
                    f.times -= 1
                return f
        return None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        table = {(m, p): h for m, p, h in self.stack.routes()}

        async def dispatch(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            seen = Seen(request.method, request.path, request.query_string, dict(request.headers),
                        list(request.headers.items()), body, raw_path=request.raw_path)
            # toolproxy's fingerprint probes are filed apart and never take a scripted fault, so
            # `seen` and `inject` stay about the traffic under test.
            is_probe = request.headers.get("User-Agent", "").startswith(USER_AGENT_PREFIX)
            (self.probes if is_probe else self.seen).append(seen)
            try:
                return await self._answer(request, seen, table, faults=not is_probe)
            except (asyncio.CancelledError, ConnectionResetError):
                if seen.outcome == "pending":  # not our own close_mid_stream cut
                    seen.outcome = "disconnected"
                    self.disconnected.set()
                raise

        app.router.add_route("*", "/{tail:.*}", dispatch)
        return app

    async def _answer(self, request: web.Request, seen: Seen, table, faults: bool = True) -> web.StreamResponse:
        fault = (self._take_fault(request.path) if faults else None) or Fault(times=0)
        if fault.stall_before:
            await asyncio.sleep(fault.stall_before)
        if fault.status is not None:
            answer = Answer(fault.status, fault.content_type, [fault.body or b""])
        else:
            answer = await self._route(request, seen.body, table)
        headers = CIMultiDict(answer.headers)
        headers.extend(fault.headers)
        if answer.content_type:
            headers["Content-Type"] = answer.content_type
        if self.stack.server_header:
            headers["Server"] = self.stack.server_header
        payload = answer.events
        if fault.gzip:
            headers["Content-Encoding"] = "gzip"
            if answer.stream:
                comp = zlib.compressobj(wbits=31)
                payload = [comp.compress(e) + comp.flush(zlib.Z_SYNC_FLUSH) for e in payload] + [comp.flush()]
            else:
                payload = [gzip_mod.compress(b"".join(payload))]
        seen.status = answer.status
        if not answer.stream:
            whole = b"".join(payload)
            if fault.close_after is None:
                seen.sent, seen.outcome = whole, "complete"
                return web.Response(status=answer.status, body=whole, headers=headers)
            headers["Content-Length"] = str(len(whole))
            resp = web.StreamResponse(status=answer.status, headers=headers)
            await resp.prepare(request)
            seen.sent = whole[: fault.close_after]
            await resp.write(seen.sent)
            return self._cut(request, seen, resp)
        resp = web.StreamResponse(status=answer.status, headers=headers)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i, event in enumerate(payload):
            if fault.close_after is not None and i >= fault.close_after:
                return self._cut(request, seen, resp)
            if fault.stall_between and i:
                await asyncio.sleep(fault.stall_between)
            seen.sent += event
            await resp.write(event)
        await resp.write_eof()
        seen.outcome = "complete"
        return resp

    def _cut(self, request: web.Request, seen: Seen, resp: web.StreamResponse) -> web.StreamResponse:
        seen.outcome = "cut"
        request.transport.close()  # flushes what was written, then FIN without the terminating chunk
        raise asyncio.CancelledError  # aiohttp drops a cancelled handler without writing anything more

    async def _route(self, request: web.Request, body: bytes, table) -> Answer:
        path = request.path
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                return self.stack.not_found()
            path = path[len(self.prefix):]
        handler = table.get((request.method, path))
        if handler is None:
            if any(p == path for _, p in table):
                return self.stack.error(405, "Method Not Allowed")
            return self.stack.not_found()
        parsed: dict = {}
        if request.method == "POST":
            try:
                parsed = orjson.loads(body) if body else {}
            except orjson.JSONDecodeError as exc:
                return self.stack.error(400, f"invalid JSON body: {exc}")
            if not isinstance(parsed, dict):
                return self.stack.error(400, "request body must be a JSON object")
        return await handler(request, parsed)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @contextlib.asynccontextmanager
    async def running(self, host: str = "127.0.0.1", port: int = 0):
        """`async with fake.running() as url:` serve on the caller's event loop."""
        url = await self.start(host, port)
        try:
            yield url
        finally:
            await self.stop()

    @contextlib.contextmanager
    def in_thread(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """`with fake.in_thread() as url:` serve from a private loop, for sync clients and fixtures."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start(host, port))
            except BaseException as exc:  # reported to the caller below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=main, name=f"fake-{self.kind}", daemon=True)
        thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        try:
            yield self.url
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


@contextlib.asynccontextmanager
async def run_fake(stack: str, **options):
    """`async with run_fake("vllm", tool_parser="hermes") as fake:` -> the started FakeStack (fake.url)."""
    fake = FakeStack(stack, **options)
    async with fake.running():
        yield fake


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m toolproxy.testing.fakes",
                                     description="Serve an emulated LLM serving stack on 127.0.0.1.")
    parser.add_argument("stack", choices=NAMES + ("no_jinja",))
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tool-parser", default=None, help="vLLM/SGLang --tool-call-parser (e.g. hermes)")
    parser.add_argument("--no-jinja", action="store_true", help="llama.cpp launched with --no-jinja")
    parser.add_argument("--call-format", choices=list(CALL_FORMATS), default=None,
                        help="how the fake model writes calls the stack does not parse")
    parser.add_argument("--reply", choices=["text", "call"], default="text",
                        help="call: the model always calls the first offered tool with {}")
    args = parser.parse_args(argv)

    def respond(req: ModelRequest) -> Reply | None:
        return call(req.tools[0], {}) if args.reply == "call" and req.tools else None

    fake = FakeStack(args.stack, tool_parser=args.tool_parser, jinja=not args.no_jinja, call_format=args.call_format,
                     responder=respond)

    async def serve() -> None:
        url = await fake.start(args.host, args.port)
        print(f"fake {fake.kind} listening on {url}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await fake.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
