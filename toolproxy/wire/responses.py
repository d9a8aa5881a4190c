"""OpenAI Responses (`/v1/responses`): the request as a chat conversation, replies read from the
response object or its named SSE events, and replies written the way OpenAI writes them.

Request: `instructions` is the system text; `input` is a string or items (`message`,
`function_call`, `function_call_output`; `reasoning` items carry nothing a chat request could);
tools are flat `{type: "function", name, description, parameters}`; `text.format` json_schema is
chat's `response_format`. Reply: `output` items (`message` with `output_text` parts,
`function_call` with `call_id`, `name`, `arguments` string, `reasoning`); usage `input_tokens`,
`output_tokens`, `input_tokens_details.cached_tokens`. Stream: every event's data carries its
`type`; some servers (llama-server) leave out `output_index`, so items are told apart by their id.
"""

from __future__ import annotations

import secrets
import time
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

_CHAT_PARAMS = {"max_output_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p"}


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(usage.get("input_tokens"), usage.get("output_tokens"), cached)


def _finish(response: dict, has_calls: bool) -> str:
    status = response.get("status")
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if has_calls else "stop"


class ResponsesReader:
    """A response object, or one stream event -> events."""

    def __init__(self) -> None:
        self.items: dict[str, int] = {}  # item id -> call index
        self.with_arguments: set[int] = set()
        self.seen_output = False
        self.n_choices = 0

    def read(self, name: str | None, obj: dict) -> list[Event]:
        kind = obj.get("type") or name
        if obj.get("object") == "response":
            return self._response(obj)
        self.n_choices = 1
        if kind in ("response.completed", "response.incomplete") and isinstance(obj.get("response"), dict):
            return self._response(obj["response"])
        if kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
            self.seen_output = True
            return [Text(obj["delta"])] if obj["delta"] else []
        if kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta") and isinstance(
            obj.get("delta"), str
        ):
            self.seen_output = True
            return [Reasoning(obj["delta"])]
        if kind in ("response.output_item.added", "response.output_item.done") and isinstance(obj.get("item"), dict):
            item = obj["item"]
            if item.get("type") != "function_call":
                return []
            self.seen_output = True
            index = self._index(item.get("id") or item.get("call_id"))
            out: list[Event] = [CallStart(index, item.get("call_id"), item.get("name"))]
            if kind.endswith(".done"):
                if index not in self.with_arguments and isinstance(item.get("arguments"), str):
                    self.with_arguments.add(index)
                    out.append(CallArguments(index, item["arguments"]))
                out.append(CallEnd(index))
            return out
        if kind == "response.function_call_arguments.delta" and isinstance(obj.get("delta"), str):
            index = self._index(obj.get("item_id"))
            self.with_arguments.add(index)
            return [CallArguments(index, obj["delta"])]
        if kind == "response.function_call_arguments.done" and isinstance(obj.get("arguments"), str):
            index = self._index(obj.get("item_id"))
            if index in self.with_arguments:
                return []
            self.with_arguments.add(index)
            return [CallArguments(index, obj["arguments"])]
        return []

    def _index(self, item_id: Any) -> int:
        key = str(item_id)
        if item_id is None and self.items:
            return max(self.items.values())
        if key not in self.items:
            self.items[key] = len(self.items)
        return self.items[key]

    def _response(self, response: dict) -> list[Event]:
        """The final response: its usage and finish, and its output unless the stream already gave it."""
        self.n_choices = 1
        out: list[Event] = []
        output = response.get("output") if isinstance(response.get("output"), list) else []
        has_calls = any(isinstance(i, dict) and i.get("type") == "function_call" for i in output)
        if not self.seen_output:
            for item in output:
                if not isinstance(item, dict):
                    continue
                if item.get("type") == "message":
                    text = text_of(item.get("content"))
                    if text:
                        out.append(Text(text))
                elif item.get("type") == "reasoning":
                    parts = (item.get("content") or []) + (item.get("summary") or [])
                    text = "".join(
                        p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
                    )
                    if text:
                        out.append(Reasoning(text))
                elif item.get("type") == "function_call":
                    index = self._index(item.get("id") or item.get("call_id"))
                    out.append(CallStart(index, item.get("call_id"), item.get("name")))
                    if item.get("arguments") is not None:
                        out.append(CallArguments(index, item["arguments"]))
                    out.append(CallEnd(index))
        usage = _usage(response.get("usage"))
        if usage is not None:
            out.append(usage)
        if response.get("status") in ("completed", "incomplete"):
            out.append(Finish(_finish(response, has_calls)))
        return out


def _content(content: Any) -> Any:
    """Message content as chat has it: a string, or its text when given as parts."""
    return content if isinstance(content, str) else text_of(content)


def read_request(body: dict[str, Any]) -> Request:
    messages: list[Any] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": _content(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if isinstance(last, dict) and last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else text_of(output),
                }
            )
    tools = []
    for tool in body.get("tools") if isinstance(body.get("tools"), list) else ():
        if isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("name"), str):
            fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
            tools.append({"type": "function", "function": fn})
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    params = {chat: body[key] for key, chat in _CHAT_PARAMS.items() if key in body}
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        params["response_format"] = {
            "type": "json_schema",
            "json_schema": {k: v for k, v in fmt.items() if k != "type"},
        }
    if body.get("previous_response_id"):
        params["previous_response_id"] = body["previous_response_id"]
    return Request(
        "responses",
        messages,
        tools,
        choice,
        bool(body.get("stream")),
        body.get("model") if isinstance(body.get("model"), str) else None,
        params,
        body,
    )


def write_request(request: Request) -> dict[str, Any]:
    """A Responses body for the request: the original's own fields kept, the conversation,
    tools, tool choice and schema written from the request."""
    body = {k: v for k, v in request.body.items() if k not in ("input", "instructions", "tools", "tool_choice")}
    system, messages = leading_system(request.messages)
    if system is not None:
        body["instructions"] = system
    items: list[dict] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": msg.get("tool_call_id"),
                    "output": text_of(msg.get("content")),
                }
            )
            continue
        if text_of(msg.get("content")) or not msg.get("tool_calls"):
            items.append({"type": "message", "role": role, "content": text_of(msg.get("content"))})
        for call in message_calls(msg):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            args = fn.get("arguments")
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id"),
                    "name": fn.get("name"),
                    "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
                }
            )
    body["input"] = items
    if request.tools:
        body["tools"] = [{"type": "function", **(t.get("function") or {})} for t in request.tools]
    if isinstance(request.tool_choice, dict):
        body["tool_choice"] = {"type": "function", "name": (request.tool_choice.get("function") or {}).get("name")}
    elif request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    fmt = request.parameters.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        body["text"] = {
            **(body.get("text") if isinstance(body.get("text"), dict) else {}),
            "format": {"type": "json_schema", **fmt.get("json_schema", {})},
        }
    return body


def _event(kind: str, **fields: Any) -> tuple[str, dict]:
    return kind, {"type": kind, **fields}


class ResponsesEncoder(BufferingEncoder):
    """A response object, or its stream of named events as OpenAI sends them (created,
    in_progress, per output item: added / deltas / done, completed), every event with
    `sequence_number` and the item's `output_index` so SDK stream helpers can follow it."""

    def __init__(self, *, model: str, stream: bool) -> None:
        super().__init__(model=model, stream=stream)
        self.id = "resp_" + secrets.token_hex(12)
        self.created = int(time.time())
        self.content_type = "text/event-stream" if stream else "application/json"
        self._seq = 0
        self._message_id = "msg_" + secrets.token_hex(12)
        self._opened = False

    def _sse(self, kind: str, **fields: Any) -> bytes:
        name, data = _event(kind, sequence_number=self._seq, **fields)
        self._seq += 1
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _response(self, status: str, output: list, usage: dict | None, incomplete: str | None = None) -> dict:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        if usage is not None:
            body["usage"] = {
                "input_tokens": usage.get("prompt_tokens", 0),
                "output_tokens": usage.get("completion_tokens", 0),
                "total_tokens": usage.get("total_tokens", 0),
                "input_tokens_details": {
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                },
                "output_tokens_details": {"reasoning_tokens": 0},
            }
        return body

    def _start(self) -> bytes:
        if self._opened:
            return b""
        self._opened = True
        head = self._response("in_progress", [], None)
        return self._sse("response.created", response=head) + self._sse("response.in_progress", response=head)

    def _message(self, text: str, status: str) -> dict:
        return {
            "type": "message",
            "id": self._message_id,
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]
            if status == "completed" or text
            else [],
        }

    def _stream_delta(self, text: str) -> bytes:
        out = self._start()
        if len(self._text) == 1:
            out += self._sse("response.output_item.added", output_index=0, item=self._message("", "in_progress"))
            out += self._sse(
                "response.content_part.added",
                item_id=self._message_id,
                output_index=0,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        return out + self._sse(
            "response.output_text.delta",
            item_id=self._message_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def error(self, message: str) -> bytes:
        if not self.stream:
            return orjson.dumps({"error": {"message": message, "type": "upstream_error", "param": None, "code": None}})
        return self._start() + self._sse("error", code="upstream_error", message=message, param=None)

    def end(self, tail: str, calls: list[Call], finish_reason: str | None, usage: dict | None) -> bytes:
        out = [self._start()] if self.stream else []
        if tail:
            out.append(self.delta(tail))
        text = "".join(self._text)
        output: list[dict] = []
        if text:
            item = self._message(text, "completed")
            output.append(item)
            if self.stream:
                part = item["content"][0]
                out.append(
                    self._sse(
                        "response.output_text.done",
                        item_id=self._message_id,
                        output_index=0,
                        content_index=0,
                        text=text,
                        logprobs=[],
                    )
                )
                out.append(
                    self._sse(
                        "response.content_part.done",
                        item_id=self._message_id,
                        output_index=0,
                        content_index=0,
                        part=part,
                    )
                )
                out.append(self._sse("response.output_item.done", output_index=0, item=item))
        for call in calls:
            index = len(output)
            item = {
                "type": "function_call",
                "id": "fc_" + secrets.token_hex(12),
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments_text(),
                "status": "completed",
            }
            output.append(item)
            if self.stream:
                out.append(
                    self._sse(
                        "response.output_item.added",
                        output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"},
                    )
                )
                out.append(
                    self._sse(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=item["arguments"],
                    )
                )
                out.append(
                    self._sse(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=index,
                        arguments=item["arguments"],
                    )
                )
                out.append(self._sse("response.output_item.done", output_index=index, item=item))
        incomplete = "max_output_tokens" if finish_reason == "length" and not calls else None
        final = self._response("incomplete" if incomplete else "completed", output, usage, incomplete)
        if not self.stream:
            return orjson.dumps(final)
        kind = "response.incomplete" if incomplete else "response.completed"
        out.append(self._sse(kind, response=final))
        return b"".join(out)
