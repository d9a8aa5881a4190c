"""A recorded body back to the bytes that crossed the wire.

Records keep bodies as text (utf8 or base64, see toolproxy.record.model) and as the stack sent
them, compressed or not; the analyzer inflates them here before the wire decoders read them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from toolproxy.record.model import body_bytes


def header(headers: Iterable, name: str) -> str | None:
    """A header value from the record's [name, value] pairs (first one wins)."""
    lname = name.lower()
    for pair in headers or ():
        if len(pair) == 2 and pair[0].lower() == lname:
            return pair[1]
    return None


def decode_body(
    text: str | None, encoding: str | None, content_encoding: str | None = None
) -> tuple[bytes | None, str | None]:
    """(plain bytes, problem). Compressed bodies are inflated; a truncated gzip stream gives what it can."""
    try:
        raw = body_bytes(text, encoding)
    except (ValueError, TypeError) as exc:
        return None, f"body is not valid {encoding}: {exc}"
    if raw is None or not content_encoding:
        return raw, None
    ce = content_encoding.strip().lower()
    if ce in ("", "identity"):
        return raw, None
    if ce in ("gzip", "x-gzip", "deflate"):
        for wbits in (zlib.MAX_WBITS | 16,) if ce != "deflate" else (zlib.MAX_WBITS, -zlib.MAX_WBITS):
            d = zlib.decompressobj(wbits)
            try:
                return d.decompress(raw) + d.flush(), None
            except zlib.error as exc:
                problem = f"cannot inflate {ce} body: {exc}"
        return None, problem
    return None, f"content-encoding {ce!r} is not supported by the analyzer"
