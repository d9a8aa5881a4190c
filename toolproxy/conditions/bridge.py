"""The bridge (`serve --bridge responses,messages`): OpenAI Responses and Anthropic Messages
requests sent to an upstream that only speaks chat completions, and the replies written back in
the client's protocol, streaming included.

The request is read into chat terms by toolproxy.wire and sent to the chat completions path
beside the one the client called (`/v1/responses` -> `/v1/chat/completions`); the reply is read
as chat and written with the client protocol's encoder: native `tool_calls` become
`function_call` items or `tool_use` blocks. The record keeps the request as the client sent it and
as it went upstream. Under a rewriting condition the same translation happens inside the
condition; this module is the `native` case, where nothing else changes.

A bridged request cannot name a stored response (`previous_response_id`): a chat-only upstream
keeps no state, so the harness is told to send the whole conversation instead (conditions.messages).
"""

from __future__ import annotations

import orjson

from toolproxy import wire
from toolproxy.conditions import ConditionOptions, Plan, Reject, RequestView, Skip
from toolproxy.conditions.messages import read_chat_request
from toolproxy.conditions.text import chat_reply

BRIDGED_FAMILIES = (wire.RESPONSES, wire.MESSAGES)


class Relay:
    """Shows all text as it arrives and adds no calls: the upstream's own calls pass through."""

    note: str | None = None

    def feed(self, text: str) -> str:
        return text

    def finish(self) -> tuple[str, list[wire.Call]]:
        self.note = "bridged to chat completions"
        return "", []


def parse_families(text: str) -> frozenset[str]:
    """`--bridge responses,messages` -> the families; a ValueError names what is not bridgeable."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(BRIDGED_FAMILIES))
    if unknown or not names:
        raise ValueError(f"--bridge takes a comma-separated list of {', '.join(BRIDGED_FAMILIES)} (got {text!r})")
    return names


def plan(request: RequestView, options: ConditionOptions) -> Plan | Reject | None:
    """The bridged request under the native condition, or None when it is not bridged."""
    if not options.bridge:
        return None
    chat = read_chat_request(
        request,
        need_tools=False,
        families=tuple(f for f in BRIDGED_FAMILIES if f in options.bridge),
        bridge=options.bridge,
    )
    if isinstance(chat, Skip):
        return None
    if isinstance(chat, Reject):
        return chat
    body = chat.upstream_body(chat.messages, keep_tools=True)
    return Plan(path=chat.upstream_path(request), body=orjson.dumps(body), transform=chat_reply(chat, Relay()))
