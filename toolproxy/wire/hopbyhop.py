"""Which headers cross a relay. The proxy, the conditions' rewritten replies, playback and replay
all pass headers on by these rules, so they are the wire's, below every one of them."""

from __future__ import annotations

from collections.abc import Iterable

# RFC 9110 section 7.6.1 hop-by-hop fields, plus the ones a relay owns or recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)
NOT_FORWARDED_UP = HOP_BY_HOP | {"host", "content-length"}
NOT_FORWARDED_DOWN = HOP_BY_HOP


def connection_listed(items: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Header names the sender listed in `Connection:`; they are hop-by-hop too."""
    names = set()
    for k, v in items:
        if k.lower() == "connection":
            names.update(part.strip().lower() for part in v.split(",") if part.strip())
    return frozenset(names)
