"""Standard chat responses built from (content, tool_calls, finish_reason, usage).

Used by every condition that rewrites the answer (text, constrained, template), so a harness gets
the same bytes a native tool-calling stack would send: OpenAI chat completion JSON or its SSE
stream (role delta, content deltas, one tool_call delta with index/id/type/name followed by one
with the arguments, finish chunk, a usage chunk only when `stream_options.include_usage` asked
for it, `data: [DONE]`), or Ollama's `/api/chat` JSON / NDJSON with arguments as objects.

An emitter is fed content as it becomes safe to show (`delta`) and told the rest at the end
(`end`); in non-streaming mode it keeps the deltas and writes one body at the end.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

import orjson


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def arguments_object(self) -> Any:
        """Arguments as Ollama sends them (an object); the raw text when it is not JSON."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


class Emitter(Protocol):
    content_type: str

    def delta(self, text: str) -> bytes: ...

    def end(self, tail: str, calls: list[ToolCall], finish_reason: str | None, usage: dict | None) -> bytes: ...

    def error(self, message: str) -> bytes:
        """The upstream answered 200 but sent only an error event: pass it on in the client's dialect."""


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _BufferingEmitter:
    """Streams each delta at once, or keeps it for the one body a non-streaming client gets."""

    def __init__(self, *, model: str, stream: bool) -> None:
        self.model = model
        self.stream = stream
        self._text: list[str] = []

    def delta(self, text: str) -> bytes:
        if not text:
            return b""
        if not self.stream:
            self._text.append(text)
            return b""
        return self._stream_delta(text)

    def _stream_delta(self, text: str) -> bytes:
        raise NotImplementedError


class OpenAIChatEmitter(_BufferingEmitter):
    def __init__(self, *, model: str, stream: bool, include_usage: bool = False) -> None:
        super().__init__(model=model, stream=stream)
        self.include_usage = include_usage
        self.id = "chatcmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.content_type = "text/event-stream" if stream else "application/json"
        self._started = False

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> bytes:
        return _sse({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        })

    def _role(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._chunk({"role": "assistant", "content": ""})

    def _stream_delta(self, text: str) -> bytes:
        return self._role() + self._chunk({"content": text})

    def error(self, message: str) -> bytes:
        err = {"error": {"message": message, "type": "upstream_error", "param": None, "code": None}}
        return _sse(err) if self.stream else orjson.dumps(err)

    def end(self, tail: str, calls: list[ToolCall], finish_reason: str | None, usage: dict | None) -> bytes:
        finish = "tool_calls" if calls else (finish_reason or "stop")
        if not self.stream:
            content = "".join(self._text) + tail
            message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
                ]
            body: dict[str, Any] = {
                "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            }
            if usage is not None:
                body["usage"] = usage
            return orjson.dumps(body)
        out = [self._role()]
        if tail:
            out.append(self._chunk({"content": tail}))
        for i, c in enumerate(calls):
            out.append(self._chunk({"tool_calls": [
                {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
            ]}))
            out.append(self._chunk({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]}))
        out.append(self._chunk({}, finish))
        if self.include_usage:
            out.append(_sse({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage,
            }))
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


def _ollama_time() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class OllamaChatEmitter(_BufferingEmitter):
    """Ollama `/api/chat`: tool calls arrive whole in one message chunk, then the `done` chunk."""

    def __init__(self, *, model: str, stream: bool) -> None:
        super().__init__(model=model, stream=stream)
        self.content_type = "application/x-ndjson" if stream else "application/json; charset=utf-8"

    def _line(self, message: dict, **extra: Any) -> bytes:
        obj = {"model": self.model, "created_at": _ollama_time(), "message": {"role": "assistant", **message}, **extra}
        return orjson.dumps(obj) + (b"\n" if self.stream else b"")

    def _stream_delta(self, text: str) -> bytes:
        return self._line({"content": text}, done=False)

    def error(self, message: str) -> bytes:
        return orjson.dumps({"error": message}) + (b"\n" if self.stream else b"")

    def end(self, tail: str, calls: list[ToolCall], finish_reason: str | None, usage: dict | None) -> bytes:
        tool_calls = [{"function": {"name": c.name, "arguments": c.arguments_object()}} for c in calls]
        counts = {}
        if usage:
            counts = {"prompt_eval_count": usage.get("prompt_tokens"), "eval_count": usage.get("completion_tokens")}
        done = {"done_reason": "length" if finish_reason == "length" else "stop", "done": True, **counts}
        if not self.stream:
            message: dict[str, Any] = {"content": "".join(self._text) + tail}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return self._line(message, **done)
        out = []
        if tail:
            out.append(self._line({"content": tail}, done=False))
        if tool_calls:
            out.append(self._line({"content": "", "tool_calls": tool_calls}, done=False))
        out.append(self._line({"content": ""}, **done))
        return b"".join(out)


def emitter_for(api: str, body: dict[str, Any], stream: bool) -> Emitter:
    """The emitter for the dialect and streaming mode the harness asked in."""
    model = body.get("model") if isinstance(body.get("model"), str) else ""
    if api == "ollama":
        return OllamaChatEmitter(model=model, stream=stream)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return OpenAIChatEmitter(model=model, stream=stream, include_usage=include_usage)
