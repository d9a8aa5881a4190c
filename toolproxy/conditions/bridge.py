"""The bridge (`serve --bridge responses,messages,gemini`): OpenAI Responses, Anthropic Messages
and Google Gemini requests sent to an upstream that only speaks chat completions, and the
replies written back in the client's protocol, streaming included.

The request is read into chat terms by toolproxy.wire and sent to the chat completions path
beside the one the client called (`/v1/responses` -> `/v1/chat/completions`; Gemini's
`/v1beta/models/M:streamGenerateContent` -> `/v1/chat/completions` with `model: M` and
`stream: true`); the reply is read as chat and written with the client protocol's encoder: native
`tool_calls` become `function_call` items, `tool_use` blocks or `functionCall` parts. Gemini's
`:countTokens` is answered from the upstream's Messages token count
(`/v1/messages/count_tokens`, which llama-server serves): the count is the stack's own, with
its chat template; an upstream without that endpoint answers an error, which the client gets in
Gemini's shape (Gemini CLI then estimates the count itself). The record keeps the request as the client sent it and
as it went upstream. Under a rewriting condition the same translation happens inside the
condition; this module is the `native` case, where nothing else changes.

A bridged request cannot name a stored response (`previous_response_id`): a chat-only upstream
keeps no state, so the harness is told to send the whole conversation instead (conditions.messages).
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

import toolproxy.wire.gemini as gemini
from toolproxy import wire
from toolproxy.conditions import ConditionOptions, Plan, Reject, RequestView, Skip
from toolproxy.conditions.messages import read_chat_request
from toolproxy.conditions.text import chat_reply
from toolproxy.wire.hopbyhop import NOT_FORWARDED_DOWN

BRIDGED_FAMILIES = (wire.RESPONSES, wire.MESSAGES, wire.GEMINI)


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


COUNT_PATH = "/v1/messages/count_tokens"


class CountReply:
    """A Messages token count (`{"input_tokens": N}`) answered as Gemini's (`{"totalTokens": N}`).
    The count is a few bytes, read whole; anything but a 2xx passes through unchanged."""

    def __init__(self) -> None:
        self.passthrough = False
        self.parts: list[bytes] = []
        self.note: str | None = None

    def start(self, status: int, headers: Mapping[str, str]) -> tuple[int, list[tuple[str, str]]]:
        if not 200 <= status < 300:
            self.passthrough = True
            self.note = f"upstream answered the token count {status}: passed through unchanged"
            drop = NOT_FORWARDED_DOWN | {"content-length"}
            return status, [(k, v) for k, v in headers.items() if k.lower() not in drop]
        return 200, [("Content-Type", "application/json; charset=UTF-8")]

    def feed(self, chunk: bytes) -> bytes:
        if self.passthrough:
            return chunk
        self.parts.append(chunk)
        return b""

    def finish(self) -> bytes:
        if self.passthrough:
            return b""
        try:
            count = orjson.loads(b"".join(self.parts)).get("input_tokens")
        except (orjson.JSONDecodeError, AttributeError):
            count = None
        if not isinstance(count, int):
            self.note = "the upstream's token count could not be read"
            return orjson.dumps(gemini.error_body("the upstream's token count could not be read", 502))
        self.note = "token count bridged from /v1/messages/count_tokens"
        return gemini.count_reply(count)


def count_plan(request: RequestView, options: ConditionOptions) -> Plan | None:
    """Gemini's `:countTokens` for a chat-only upstream, or None when this is no such request."""
    if wire.GEMINI not in options.bridge or request.method != "POST":
        return None
    if gemini.method_of(request.path) != gemini.COUNT_TOKENS:
        return None
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    counted = gemini.count_request(body, request.path)
    written = wire.write_request(wire.MESSAGES, counted)
    sent = {"model": counted.model or "", **{k: written[k] for k in ("system", "messages", "tools") if k in written}}
    return Plan(path=gemini.sibling_path(request.path, COUNT_PATH), body=orjson.dumps(sent), transform=CountReply())
