"""What one probe request got back, in the terms doctor and conformance judge it by.

A reply is read from the recorded exchange (status, body, the proxy's error kind), never from an
SDK's exception, so "the upstream refused" and "the upstream could not be reached" stay apart:
the first is a serving-layer verdict, the second a transport failure that says nothing about tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from toolproxy.calls import parse_arguments, parse_text, validate_call
from toolproxy.calls.model import TextCall, TextParse
from toolproxy.stacks.errors import error_text

# Error kinds the proxy records when no upstream answer exists (toolproxy.proxy.forward).
TRANSPORT_ERRORS = frozenset({"connect", "timeout", "upstream_closed", "upstream_error", "proxy_error", "client_closed"})


@dataclass(frozen=True, slots=True)
class Call:
    name: str | None
    raw_arguments: Any
    arguments: Any
    error: str | None


@dataclass(slots=True)
class Reply:
    status: int | None
    body: bytes
    error_kind: str | None = None
    error_message: str | None = None
    content: str = ""
    calls: list[Call] = field(default_factory=list)
    finish_reason: str | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    has_message: bool = False

    @property
    def transport_failed(self) -> bool:
        return self.error_kind in TRANSPORT_ERRORS or self.status is None

    @property
    def refused(self) -> bool:
        return not self.transport_failed and self.status >= 400

    @property
    def empty(self) -> bool:
        """Accepted, yet nothing came back: no message, or neither content nor calls."""
        return not self.transport_failed and not self.refused and not self.content.strip() and not self.calls

    @property
    def error_text(self) -> str:
        """The stack's own words: its error message, or the raw body when it is not the usual shape."""
        if self.error_message and self.transport_failed:
            return self.error_message
        return error_text(self.body)

    def text_calls(self, tools: list[dict]) -> TextParse:
        """Calls the model wrote into `content` (the stack did not extract them)."""
        return parse_text(self.content, tool_names=[_tool_name(t) for t in tools])

    def outcome(self) -> str:
        """A short word for a matrix cell or a log line."""
        if self.transport_failed:
            return "transport"
        if self.refused:
            return f"http_{self.status}"
        if self.calls:
            return "call"
        return "empty" if self.empty else "text"


def _tool_name(tool: dict) -> str:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return str(fn.get("name", ""))


def read_reply(status: int | None, body: bytes, error_kind: str | None = None, error_message: str | None = None) -> Reply:
    """A non-streaming OpenAI chat completion (or an error) as a Reply; never raises."""
    reply = Reply(status=status, body=body, error_kind=error_kind, error_message=error_message)
    if reply.transport_failed or reply.refused:
        return reply
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return reply
    if not isinstance(data, dict):
        return reply
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    timings = data.get("timings") if isinstance(data.get("timings"), dict) else {}
    cached = details.get("cached_tokens", timings.get("cache_n"))
    reply.cached_tokens = cached if isinstance(cached, int) else None
    reply.prompt_tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return reply
    choice = choices[0]
    reply.finish_reason = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    message = choice.get("message")
    if not isinstance(message, dict):
        return reply
    reply.has_message = True
    reply.content = message.get("content") if isinstance(message.get("content"), str) else ""
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc, dict) and isinstance(tc.get("function"), dict) else {}
        raw = fn.get("arguments")
        value, err = parse_arguments(raw)
        name = fn.get("name") if isinstance(fn.get("name"), str) else None
        reply.calls.append(Call(name, raw, value, err))
    return reply


def call_problems(call: Call | TextCall, tools: list[dict]) -> list[str]:
    """Why a call (native, or found in text) is not a valid call of an offered tool; empty: valid."""
    v = validate_call(call.name, call.raw_arguments if call.error else call.arguments, tools)
    return [] if v.valid else list(v.errors)
