"""Ollama's native API: `/api/chat` (message objects) and `/api/generate` (a `response` string),
both one JSON object, or NDJSON when streamed (the default). Tool calls arrive whole, arguments
as JSON objects and without ids; the last line has `done: true`, `done_reason` and the counts.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from .chat import ChatReader
from .model import BufferingEncoder, Call, CallArguments, CallStart, Event, Finish, Reasoning, Text, Usage


class OllamaReader:
    def __init__(self) -> None:
        self.chat = ChatReader()  # an OpenAI-shaped body on an Ollama path (a proxy in between)
        self.n_calls = 0
        self.n_choices = 0

    def read(self, name: str | None, obj: dict) -> list[Event]:
        if "choices" in obj:
            out = self.chat.read(name, obj)
            self.n_choices = max(self.n_choices, self.chat.n_choices)
            return out
        self.n_choices = 1
        out: list[Event] = []
        msg = obj.get("message")
        if isinstance(msg, dict):
            if msg.get("content"):
                out.append(Text(_str(msg["content"])))
            if msg.get("thinking"):
                out.append(Reasoning(_str(msg["thinking"])))
            calls = msg.get("tool_calls")
            for c in calls if isinstance(calls, list) else ():
                if isinstance(c, dict):
                    fn = c.get("function") if isinstance(c.get("function"), dict) else {}
                    idx = self.n_calls
                    self.n_calls += 1
                    out.append(CallStart(idx, c.get("id"), fn.get("name")))
                    if fn.get("arguments") is not None:
                        out.append(CallArguments(idx, fn["arguments"]))
        if isinstance(obj.get("response"), str):
            if obj["response"]:
                out.append(Text(obj["response"]))
            if obj.get("thinking"):
                out.append(Reasoning(_str(obj["thinking"])))
        if obj.get("done"):
            prompt, completion = obj.get("prompt_eval_count"), obj.get("eval_count")
            if isinstance(prompt, int) or isinstance(completion, int):
                out.append(
                    Usage(
                        prompt if isinstance(prompt, int) else None, completion if isinstance(completion, int) else None
                    )
                )
            out.append(Finish(obj.get("done_reason") or "stop"))
        return out


def _str(piece: Any) -> str:
    return piece if isinstance(piece, str) else orjson.dumps(piece).decode()


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class OllamaChatEncoder(BufferingEncoder):
    """`/api/chat` as Ollama writes it: tool calls whole in one message chunk, then the `done` chunk."""

    def __init__(self, *, model: str, stream: bool) -> None:
        super().__init__(model=model, stream=stream)
        self.content_type = "application/x-ndjson" if stream else "application/json; charset=utf-8"

    def _line(self, message: dict, **extra: Any) -> bytes:
        obj = {"model": self.model, "created_at": _now(), "message": {"role": "assistant", **message}, **extra}
        return orjson.dumps(obj) + (b"\n" if self.stream else b"")

    def _stream_delta(self, text: str) -> bytes:
        return self._line({"content": text}, done=False)

    def error(self, message: str) -> bytes:
        return orjson.dumps({"error": message}) + (b"\n" if self.stream else b"")

    def end(self, tail: str, calls: list[Call], finish_reason: str | None, usage: dict | None) -> bytes:
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
