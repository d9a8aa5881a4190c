"""Chat completions (`/v1/chat/completions`) and text completions (`/v1/completions`, llama.cpp
`/completion`): reading replies, writing them, and the request in the shared model.

Stream deltas carry tool calls as `{index, id?, type?, function: {name?, arguments?}}`; argument
fragments concatenate in order. Some servers omit `index` (older Ollama sends each call whole):
then a new `id` opens a new call and an id-less fragment continues the last one. With n > 1 only
the first choice counts, because that is the one a harness acts on.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

from .model import BufferingEncoder, Call, CallArguments, CallStart, Event, Finish, Reasoning, Request, Text, Usage


def usage_event(usage: Any, timings: Any = None) -> Usage | None:
    """Token counts from an OpenAI `usage` object and/or llama.cpp `timings`.

    llama-server streams its `timings` (`predicted_n`: tokens generated) on the last chunk even
    when the client asked for no usage block, so a streamed reply's completion count is known
    either way; `prompt_n` is only the part of the prompt not served from the cache, so the
    prompt count comes from `usage` alone.
    """
    u = usage if isinstance(usage, dict) else {}
    t = timings if isinstance(timings, dict) else {}
    details = u.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and isinstance(t.get("cache_n"), int):
        cached = t["cache_n"]
    prompt, completion = u.get("prompt_tokens"), u.get("completion_tokens")
    if completion is None and isinstance(t.get("predicted_n"), int):
        completion = t["predicted_n"]
    if prompt is None and completion is None and cached is None:
        return None
    return Usage(prompt, completion, cached)


class ChatReader:
    """One chat (or completions) reply object -> events."""

    def __init__(self) -> None:
        self.ids: dict[int, str | None] = {}
        self.n_choices = 0

    def read(self, name: str | None, obj: dict) -> list[Event]:
        # Called once per stream chunk (hundreds per reply): the common content delta costs a few
        # lookups; rarer fields are only looked at when the delta has more than its content.
        out: list[Event] = []
        if "usage" in obj or "timings" in obj:
            u = usage_event(obj.get("usage"), obj.get("timings"))
            if u is not None:
                out.append(u)
        choices = obj.get("choices")
        if not isinstance(choices, list):
            if isinstance(obj.get("content"), str):
                out.extend(self._llamacpp(obj))
            return out
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            idx = choice.get("index", 0)
            if isinstance(idx, int) and idx >= self.n_choices:
                self.n_choices = idx + 1
            if idx not in (0, None):
                continue
            msg = choice.get("delta")
            if not isinstance(msg, dict):
                msg = choice.get("message")
            if isinstance(msg, dict):
                content = msg.get("content")
                if content:
                    out.append(Text(content if isinstance(content, str) else _text(content)))
                if not msg.keys() <= _PLAIN:
                    out += self._rare(msg)
            if "text" in choice and isinstance(choice["text"], str) and choice["text"]:
                out.append(Text(choice["text"]))
            if choice.get("finish_reason"):
                out.append(_finish(choice["finish_reason"], choice.get("matched_stop", choice.get("stop_reason"))))
        return out

    def _rare(self, msg: dict) -> list[Event]:
        """Reasoning and calls: what a message has beyond its role and text."""
        out: list[Event] = []
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            out.append(Reasoning(_text(reasoning)))
        if msg.get("tool_calls"):
            out.extend(self._calls(msg["tool_calls"]))
        if isinstance(msg.get("function_call"), dict):
            out.extend(self._calls([{"index": 0, "function": msg["function_call"]}]))
        return out

    def _calls(self, deltas: Any) -> list[Event]:
        if not isinstance(deltas, list):
            return []
        out: list[Event] = []
        for d in deltas:
            if not isinstance(d, dict):
                continue
            idx = d.get("index")
            cid = d.get("id")
            if not isinstance(cid, str):
                cid = None
            if not isinstance(idx, int):
                if cid is not None:
                    known = [i for i, c in self.ids.items() if c == cid]
                    idx = known[0] if known else len(self.ids)
                else:
                    idx = max(self.ids) if self.ids else 0
            if idx not in self.ids or (cid and not self.ids[idx]):
                self.ids[idx] = self.ids.get(idx) or cid
            fn = d.get("function")
            if not isinstance(fn, dict):
                fn = {}
            name = fn.get("name")
            out.append(CallStart(idx, cid, None if name is None else _name(name)))
            arguments = fn.get("arguments")
            if arguments is not None:
                out.append(CallArguments(idx, arguments))
        return out

    def _llamacpp(self, obj: dict) -> list[Event]:
        self.n_choices = max(self.n_choices, 1)
        out: list[Event] = [Text(obj["content"])] if obj["content"] else []
        if isinstance(obj.get("tokens_evaluated"), int) or isinstance(obj.get("tokens_predicted"), int):
            out.append(Usage(obj.get("tokens_evaluated"), obj.get("tokens_predicted")))
        if obj.get("stop"):
            kind = obj.get("stop_type") if isinstance(obj.get("stop_type"), str) else None
            reason = "length" if kind == "limit" or obj.get("truncated") else "stop"
            word = obj.get("stopping_word")
            out.append(Finish(reason, kind or None, word if isinstance(word, str) and word else None))
        return out


def _finish(reason: Any, matched: Any) -> Finish:
    """A choice's finish, with SGLang's `matched_stop` or vLLM's `stop_reason`: the stop string that
    matched, or the id of the stop token (an end-of-sequence token) that ended generation."""
    if isinstance(matched, str) and matched:
        return Finish(reason, "word", matched)
    if isinstance(matched, int) and not isinstance(matched, bool):
        return Finish(reason, "eos")
    return Finish(reason)


# A message with no other keys than these has nothing for _rare to read.
_PLAIN = frozenset(("role", "content"))


def _text(piece: Any) -> str:
    return piece if isinstance(piece, str) else orjson.dumps(piece).decode()


def read_request(body: dict[str, Any]) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list):
        prompt = body.get("prompt")
        messages = (
            []
            if prompt is None
            else [{"role": "user", "content": prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()}]
        )
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    params = {
        k: v for k, v in body.items() if k not in ("messages", "tools", "tool_choice", "model", "stream", "prompt")
    }
    return Request(
        "chat",
        messages,
        tools,
        body.get("tool_choice"),
        bool(body.get("stream")),
        body.get("model") if isinstance(body.get("model"), str) else None,
        params,
        body,
    )


def write_request(request: Request) -> dict[str, Any]:
    """A chat-completions body for the request (usage asked for when streaming)."""
    body: dict[str, Any] = {"model": request.model or "", "messages": request.messages}
    if request.tools:
        body["tools"] = request.tools
    if request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    body.update(request.parameters)
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class ChatEncoder(BufferingEncoder):
    """A chat completion as an OpenAI server writes it: one JSON body, or its SSE stream (role
    delta, content deltas, per call a delta with index/id/type/name then one with the arguments,
    the finish chunk, a usage chunk only when `stream_options.include_usage` asked, `[DONE]`)."""

    def __init__(self, *, model: str, stream: bool, include_usage: bool = False) -> None:
        super().__init__(model=model, stream=stream)
        self.include_usage = include_usage
        self.id = "chatcmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.content_type = "text/event-stream" if stream else "application/json"
        self._started = False

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> bytes:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }
        )

    def _role(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._chunk({"role": "assistant", "content": ""})

    def _stream_delta(self, text: str) -> bytes:
        return self._role() + self._chunk({"content": text})

    def error(self, message: str) -> bytes:
        err = {"error": {"message": message, "type": "upstream_error", "param": None, "code": None}}
        return sse(err) if self.stream else orjson.dumps(err)

    def end(self, tail: str, calls: list[Call], finish_reason: str | None, usage: dict | None) -> bytes:
        finish = "tool_calls" if calls else (finish_reason or "stop")
        if not self.stream:
            content = "".join(self._text) + tail
            message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_text()}}
                    for c in calls
                ]
            body: dict[str, Any] = {
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            }
            if usage is not None:
                body["usage"] = usage
            return orjson.dumps(body)
        out = [self._role()]
        if tail:
            out.append(self._chunk({"content": tail}))
        for i, c in enumerate(calls):
            out.append(
                self._chunk(
                    {
                        "tool_calls": [
                            {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
                        ]
                    }
                )
            )
            out.append(self._chunk({"tool_calls": [{"index": i, "function": {"arguments": c.arguments_text()}}]}))
        out.append(self._chunk({}, finish))
        if self.include_usage:
            out.append(
                sse(
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


def _name(value) -> str | None:
    """A call's name as the stack wrote it: a name that is not a string (a model can write 5) is
    kept as its JSON text, so the call is judged as naming no offered tool rather than dropped."""
    if isinstance(value, str):
        return value or None
    return None if value is None else orjson.dumps(value).decode()
