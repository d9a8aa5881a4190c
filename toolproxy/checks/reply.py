"""What one probe request got back, in the terms doctor and conformance judge it by.

A reply is read from the recorded exchange (status, body, the proxy's error kind), never from an
SDK's exception, so "the upstream refused" and "the upstream could not be reached" stay apart:
the first is a serving-layer verdict, the second a transport failure that says nothing about tools.
The body itself is read by toolproxy.wire, the same decoder the conditions and the analyzer use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolproxy import wire
from toolproxy.calls import parse_arguments, parse_text, validate_call
from toolproxy.calls.model import TextCall, TextParse

# Error kinds the proxy records when no upstream answer exists (toolproxy.proxy.forward).
TRANSPORT_ERRORS = frozenset(
    {"connect", "timeout", "upstream_closed", "upstream_error", "proxy_error", "client_closed"}
)


@dataclass(slots=True)
class ProbeReply:
    status: int | None
    body: bytes
    error_kind: str | None = None
    error_message: str | None = None
    message: wire.Reply = field(default_factory=wire.Reply)

    @property
    def transport_failed(self) -> bool:
        return self.error_kind in TRANSPORT_ERRORS or self.status is None

    @property
    def refused(self) -> bool:
        return not self.transport_failed and self.status >= 400

    @property
    def content(self) -> str:
        return self.message.content or ""

    @property
    def calls(self) -> list[wire.Call]:
        return self.message.tool_calls

    @property
    def finish_reason(self) -> str | None:
        return self.message.finish_reason

    @property
    def cached_tokens(self) -> int | None:
        return self.message.cached_tokens

    @property
    def prompt_tokens(self) -> int | None:
        return self.message.prompt_tokens

    @property
    def empty(self) -> bool:
        """Accepted, yet nothing came back: no message, or neither content nor calls."""
        return not self.transport_failed and not self.refused and not self.content.strip() and not self.calls

    @property
    def error_text(self) -> str:
        """The stack's own words: its error message, or the raw body when it is not the usual shape."""
        if self.error_message and self.transport_failed:
            return self.error_message
        return wire.error_text(self.body)

    def text_calls(self, tools: list[dict]) -> TextParse:
        """Calls the model wrote into `content` (the stack did not extract them)."""
        return parse_text(self.content, tool_names=wire.tool_names(tools))

    def outcome(self) -> str:
        """A short word for a matrix cell or a log line."""
        if self.transport_failed:
            return "transport"
        if self.refused:
            return f"http_{self.status}"
        if self.calls:
            return "call"
        return "empty" if self.empty else "text"


def read_reply(
    status: int | None,
    body: bytes,
    error_kind: str | None = None,
    error_message: str | None = None,
    family: str = wire.CHAT,
) -> ProbeReply:
    """A reply (or an error) of the given protocol family as a ProbeReply; never raises."""
    reply = ProbeReply(status=status, body=body, error_kind=error_kind, error_message=error_message)
    if not reply.transport_failed and not reply.refused:
        reply.message = wire.decode(body, family)
    return reply


def call_problems(call: wire.Call | TextCall, tools: list[dict]) -> list[str]:
    """Why a call (native, or found in text) is not a valid call of an offered tool; empty: valid."""
    if isinstance(call, TextCall):
        v = validate_call(call.name, call.raw_arguments if call.error else call.arguments, tools)
    else:
        value, error = parse_arguments(call.arguments)
        v = validate_call(call.name, call.arguments if error else value, tools)
    return [] if v.valid else list(v.errors)
