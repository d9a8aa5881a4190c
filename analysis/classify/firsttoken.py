"""When the first token of a reply arrived, beside when its first byte did.

A stack that streams may send bytes that are no part of the reply before the model has produced
anything: llama-server (since b9478) writes a `:` comment line every few seconds while it processes
a long prompt, to keep the connection open. The first byte then comes in milliseconds and says
nothing of how long the model took: time to first byte is the server's, time to first token the
model's. The record keeps when each piece of a streamed body arrived (`extra.piece_ms`: where each
piece ended, in bytes, and when, in ms since the exchange started); the first token is in the first
piece that reaches past the keep-alive comments, to the first event line. Pure.
"""

from __future__ import annotations

from typing import Any


def first_event_at(body: bytes) -> int | None:
    """The byte offset where the first SSE line that is not a comment (nor blank) starts, or None
    when the body holds only comments (the stream ended, or was given up, before any event)."""
    at = 0
    size = len(body)
    while at < size:
        end = body.find(b"\n", at)
        end = size if end < 0 else end
        line = body[at:end].strip()
        if line and not line.startswith(b":"):
            return at
        at = end + 1
    return None


def first_token_ms(
    body: str | bytes | None, ttfb_ms: float | None, piece_ms: Any, streamed: bool | None
) -> float | None:
    """Milliseconds from the exchange's start to its reply's first token: ttfb_ms for a reply whose
    first byte is already part of it (a whole JSON body, a stream that starts with an event), the
    arrival of the piece holding the first event after keep-alive comments, None when no event ever
    came (only comments, or nothing)."""
    if not body:
        return None
    raw = body.encode() if isinstance(body, str) else body
    if not streamed:
        return ttfb_ms
    at = first_event_at(raw)
    if at is None:
        return None
    if at == 0:
        return ttfb_ms
    if isinstance(piece_ms, list):
        for mark in piece_ms:
            if (
                isinstance(mark, (list, tuple))
                and len(mark) == 2
                and isinstance(mark[0], (int, float))
                and mark[0] > at
            ):
                return float(mark[1])
    # a body that came in one piece keeps no marks: its first byte was its first token's
    return ttfb_ms
