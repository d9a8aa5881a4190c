"""The proxy's own error answers, in the JSON shape the client's protocol reads its message from,
so a harness shows the cause instead of failing to parse: used by the handler, the admin routes
and playback."""

from __future__ import annotations

import orjson

from toolproxy import wire
from toolproxy.wire.gemini import error_body as gemini_error


def error_body(message: str, code: str, kind: str = "toolproxy_error") -> bytes:
    """OpenAI-style error JSON, so harnesses surface the cause instead of a parse failure."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def protocol_error_body(family: str | None, message: str, code: str, status: int = 500) -> bytes:
    """The error JSON a client of `family` reads its message from: Anthropic's, Ollama's and
    Google's SDKs look for their own shape (Google's names the HTTP status), every other protocol
    for OpenAI's."""
    if family in (wire.MESSAGES, wire.OLLAMA_CHAT, wire.OLLAMA_GENERATE):
        return wire.encoder_for(family, {}, False).error(message)
    if family == wire.GEMINI:
        return orjson.dumps(gemini_error(message, status))
    return error_body(message, code)
