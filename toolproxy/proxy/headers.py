"""Which headers cross the proxy, and how secrets are kept off disk."""

from __future__ import annotations

import hashlib
import re
from typing import Iterable
from urllib.parse import parse_qsl, urlencode

# RFC 9110 section 7.6.1 hop-by-hop fields, plus the ones this proxy owns or recomputes.
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

TAG_HEADER_PREFIX = "x-toolproxy-"

_SECRET_NAME = re.compile(r"authorization|cookie|api[-_]?key|token|secret|password|session", re.I)
_SECRET_PARAM = re.compile(r"^(key|api[-_]?key|access[-_]?token|token|secret|password|sig|signature)$", re.I)


def redact_value(value: str) -> str:
    """A stand-in that tells keys apart without revealing them."""
    return "redacted:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:8]


_secret_names: dict[str, bool] = {}


def is_secret_header(name: str) -> bool:
    # Memoised: the same few dozen header names recur on every request of the hot path.
    secret = _secret_names.get(name)
    if secret is None:
        secret = _SECRET_NAME.search(name) is not None
        if len(_secret_names) < 4096:
            _secret_names[name] = secret
    return secret


def redact_headers(items: Iterable[tuple[str, str]]) -> list[list[str]]:
    return [[k, redact_value(v) if is_secret_header(k) else v] for k, v in items]


def connection_listed(items: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Header names the sender listed in `Connection:`; they are hop-by-hop too."""
    names = set()
    for k, v in items:
        if k.lower() == "connection":
            names.update(part.strip().lower() for part in v.split(",") if part.strip())
    return frozenset(names)


def redact_query(query: str) -> str:
    """Query strings carry keys too (e.g. `?key=` on hosted APIs)."""
    if not query or "=" not in query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(_SECRET_PARAM.match(k) for k, _ in pairs):
        return query
    return urlencode([(k, redact_value(v) if _SECRET_PARAM.match(k) else v) for k, v in pairs])
