"""Anthropic Messages (`/v1/messages`): the request as a chat conversation, replies read from the
message object or its SSE events, and replies written the way Anthropic writes them.

Request: `system` (a string or text blocks), `messages` whose content is a string or blocks
(`text`, `tool_use` {id, name, input}, `tool_result` {tool_use_id, content}), tools
`{name, description, input_schema}`, `tool_choice` {type: auto|any|tool|none}. Reply: `content`
blocks, `stop_reason` (end_turn, tool_use, max_tokens, stop_sequence), usage. `input_tokens`
leaves out tokens read from or written to the prompt cache, so the prompt count here adds them
back, as chat's `prompt_tokens` counts the whole prompt. Stream: `message_start`,
`content_block_start` / `_delta` (`text_delta`, `input_json_delta`, `thinking_delta`) / `_stop`,
`message_delta` (stop_reason, usage), `message_stop`, `ping`, `error`. A JSON schema for the
reply rides in `output_config.format` ({type: json_schema, schema}), chat's `response_format`.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from .model import (
    BufferingEncoder,
    Call,
    CallArguments,
    CallEnd,
    CallStart,
    Event,
    Finish,
    Reasoning,
    Request,
    Text,
    Usage,
    leading_system,
    message_calls,
    text_of,
)

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
    "pause_turn": "stop",
}
_ANTHROPIC_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    ints = {
        k: usage.get(k)
        for k in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    }
    ints = {k: v if isinstance(v, int) else None for k, v in ints.items()}
    prompt = None
    if ints["input_tokens"] is not None:
        prompt = (
            ints["input_tokens"] + (ints["cache_read_input_tokens"] or 0) + (ints["cache_creation_input_tokens"] or 0)
        )
    return Usage(prompt, ints["output_tokens"], ints["cache_read_input_tokens"])


class MessagesReader:
    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}  # content block index -> call index
        self.with_arguments: set[int] = set()
        self.pending: dict[int, Any] = {}  # a streamed tool_use's start `input`, used if no delta follows
        self.n_choices = 0
        self.n_calls = 0

    def read(self, name: str | None, obj: dict) -> list[Event]:
        kind = obj.get("type") or name
        if kind == "message":
            return self._message(obj)
        self.n_choices = 1
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            u = _usage(obj["message"].get("usage"))
            return [u] if u is not None else []
        block_index = obj.get("index") if isinstance(obj.get("index"), int) else 0
        if kind == "content_block_start" and isinstance(obj.get("content_block"), dict):
            block = obj["content_block"]
            if block.get("type") == "tool_use":
                index = self.blocks.setdefault(block_index, len(self.blocks))
                self.pending[index] = block.get("input")
                return [CallStart(index, block.get("id"), block.get("name"))]
            if block.get("type") == "text" and block.get("text"):
                return [Text(block["text"])]
            return []
        if kind == "content_block_delta" and isinstance(obj.get("delta"), dict):
            delta = obj["delta"]
            dtype = delta.get("type")
            if dtype == "text_delta" and isinstance(delta.get("text"), str):
                return [Text(delta["text"])] if delta["text"] else []
            if dtype == "thinking_delta" and isinstance(delta.get("thinking"), str):
                return [Reasoning(delta["thinking"])]
            if dtype == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                index = self.blocks.setdefault(block_index, len(self.blocks))
                self.with_arguments.add(index)
                return [CallArguments(index, delta["partial_json"])]
            return []
        if kind == "content_block_stop" and block_index in self.blocks:
            index = self.blocks[block_index]
            start = self.pending.pop(index, None)
            if index not in self.with_arguments and start is not None:
                return [CallArguments(index, start), CallEnd(index)]
            return [CallEnd(index)]
        if kind == "message_delta":
            out: list[Event] = []
            u = _usage(obj.get("usage"))
            if u is not None:
                out.append(u)
            delta = obj.get("delta") if isinstance(obj.get("delta"), dict) else {}
            if delta.get("stop_reason"):
                out.append(_finish(delta))
            return out
        return []

    def _message(self, msg: dict) -> list[Event]:
        self.n_choices = 1
        out: list[Event] = []
        for block in msg.get("content") if isinstance(msg.get("content"), list) else ():
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"]:
                out.append(Text(block["text"]))
            elif block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
                out.append(Reasoning(block["thinking"]))
            elif block.get("type") == "tool_use":
                index = self.n_calls
                self.n_calls += 1
                out.append(CallStart(index, block.get("id"), block.get("name")))
                out.append(CallArguments(index, block.get("input")))
                out.append(CallEnd(index))
        u = _usage(msg.get("usage"))
        if u is not None:
            out.append(u)
        if msg.get("stop_reason"):
            out.append(_finish(msg))
        return out


def _finish(msg: dict) -> Finish:
    """The message's stop_reason, and the stop sequence that ended it when one did: Anthropic says
    `stop_reason: stop_sequence`; llama-server says `end_turn` but still names the `stop_sequence`."""
    reason = msg["stop_reason"]
    word = msg.get("stop_sequence")
    if isinstance(word, str) and word:
        return Finish(STOP_REASONS.get(reason, reason), "word", word)
    return Finish(STOP_REASONS.get(reason, reason), "word" if reason == "stop_sequence" else None)


def _blocks_text(content: Any) -> str:
    return content if isinstance(content, str) else text_of(content)


def read_request(body: dict[str, Any]) -> Request:
    messages: list[Any] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _blocks_text(system)})
    for msg in body.get("messages") if isinstance(body.get("messages"), list) else ():
        if not isinstance(msg, dict):
            continue
        role, content = msg.get("role"), msg.get("content")
        if isinstance(content, str) or not isinstance(content, list):
            messages.append({"role": role, "content": content if isinstance(content, str) else ""})
            continue
        text = text_of(content)
        calls = [
            {
                "id": b.get("id"),
                "type": "function",
                "function": {"name": b.get("name"), "arguments": orjson.dumps(b.get("input", {})).decode()},
            }
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        for r in results:
            messages.append(
                {"role": "tool", "tool_call_id": r.get("tool_use_id"), "content": _blocks_text(r.get("content"))}
            )
        if calls:
            messages.append({"role": role, "content": text or None, "tool_calls": calls})
        elif text or not results:
            messages.append({"role": role, "content": text})
    tools = []
    for tool in body.get("tools") if isinstance(body.get("tools"), list) else ():
        if isinstance(tool, dict) and isinstance(tool.get("name"), str) and tool.get("type") in (None, "custom"):
            fn = {"name": tool["name"]}
            if "description" in tool:
                fn["description"] = tool["description"]
            fn["parameters"] = (
                tool.get("input_schema") if isinstance(tool.get("input_schema"), dict) else {"type": "object"}
            )
            tools.append({"type": "function", "function": fn})
    choice: Any = body.get("tool_choice")
    if isinstance(choice, dict):
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(choice.get("type")) or (
            {"type": "function", "function": {"name": choice.get("name")}} if choice.get("type") == "tool" else None
        )
    params = {k: body[k] for k in ("max_tokens", "temperature", "top_p") if k in body}
    if "stop_sequences" in body:
        params["stop"] = body["stop_sequences"]
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        params["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt.get("schema")},
        }
    return Request(
        "messages",
        messages,
        tools,
        choice,
        bool(body.get("stream")),
        body.get("model") if isinstance(body.get("model"), str) else None,
        params,
        body,
    )


def write_request(request: Request) -> dict[str, Any]:
    """A Messages body for the request: the original's own fields kept, the conversation (tool
    results folded into user turns, calls as tool_use blocks), tools and tool choice written from it."""
    body = {k: v for k, v in request.body.items() if k not in ("system", "messages", "tools", "tool_choice")}
    system, messages = leading_system(request.messages)
    if system is not None:
        body["system"] = system
    out: list[dict] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        blocks: list[dict] = []
        if role == "tool":
            role = "user"
            blocks.append(
                {"type": "tool_result", "tool_use_id": msg.get("tool_call_id"), "content": text_of(msg.get("content"))}
            )
        elif text_of(msg.get("content")):
            blocks.append({"type": "text", "text": text_of(msg.get("content"))})
        for call in message_calls(msg):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            c = Call(0, call.get("id"), fn.get("name"), fn.get("arguments"))
            blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments_object()})
        if role in ("system", "developer"):
            role = "user"
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    body["messages"] = out
    if request.tools:
        body["tools"] = [
            {
                "name": fn.get("name"),
                "description": fn.get("description", ""),
                "input_schema": fn.get("parameters") or {"type": "object"},
            }
            for fn in (t.get("function") or {} for t in request.tools)
        ]
    fmt = request.parameters.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        config = body.get("output_config") if isinstance(body.get("output_config"), dict) else {}
        body["output_config"] = {
            **config,
            "format": {"type": "json_schema", "schema": (fmt.get("json_schema") or {}).get("schema")},
        }
    choice = request.tool_choice
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    elif choice in ("auto", "none"):
        body["tool_choice"] = {"type": choice}
    elif choice == "required":
        body["tool_choice"] = {"type": "any"}
    return body


def _sse(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


class MessagesEncoder(BufferingEncoder):
    """A message object, or its event stream as Anthropic sends it (message_start, a text block
    opened on the first delta, one tool_use block per call with its input as one
    input_json_delta, message_delta with the stop reason and usage, message_stop)."""

    def __init__(self, *, model: str, stream: bool) -> None:
        super().__init__(model=model, stream=stream)
        self.id = "msg_" + secrets.token_hex(12)
        self.content_type = "text/event-stream" if stream else "application/json"
        self._started = False
        self._block_open = False

    def _message(self, content: list, stop: str | None, usage: dict | None) -> dict:
        u = usage or {}
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": max(u.get("prompt_tokens", 0) - cached, 0),
                "output_tokens": u.get("completion_tokens", 0),
                "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0,
            },
        }

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return _sse("message_start", {"message": self._message([], None, None)})

    def _stream_delta(self, text: str) -> bytes:
        out = self._start()
        if not self._block_open:
            self._block_open = True
            out += _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        return out + _sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})

    def error(self, message: str) -> bytes:
        err = {"type": "error", "error": {"type": "api_error", "message": message}}
        return _sse("error", {"error": err["error"]}) if self.stream else orjson.dumps(err)

    def end(self, tail: str, calls: list[Call], finish_reason: str | None, usage: dict | None) -> bytes:
        stop = "tool_use" if calls else _ANTHROPIC_STOP.get(finish_reason or "stop", "end_turn")
        out = [self._start()] if self.stream else []
        if tail:
            out.append(self.delta(tail))
        text = "".join(self._text)
        content: list[dict] = [{"type": "text", "text": text}] if text else []
        if self._block_open:
            out.append(_sse("content_block_stop", {"index": 0}))
        for call in calls:
            index = len(content)
            block = {
                "type": "tool_use",
                "id": call.id or "toolu_" + secrets.token_hex(12),
                "name": call.name,
                "input": call.arguments_object(),
            }
            content.append(block)
            if self.stream:
                out.append(_sse("content_block_start", {"index": index, "content_block": {**block, "input": {}}}))
                out.append(
                    _sse(
                        "content_block_delta",
                        {
                            "index": index,
                            "delta": {
                                "type": "input_json_delta",
                                "partial_json": orjson.dumps(block["input"]).decode(),
                            },
                        },
                    )
                )
                out.append(_sse("content_block_stop", {"index": index}))
        if not self.stream:
            return orjson.dumps(self._message(content, stop, usage))
        u = self._message([], stop, usage)["usage"]
        out.append(_sse("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": u}))
        out.append(_sse("message_stop", {}))
        return b"".join(out)
