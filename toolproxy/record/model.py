"""One record per exchange (docs/record.md).

Records are data, not logs: every field below is part of a versioned schema that the analyzer
reads. Bump RECORD_VERSION whenever a field changes meaning, and keep the reader accepting every
older version.

A plain dataclass (not pydantic) because one is built on the proxy's hot path for every request,
and orjson serialises dataclasses natively without an intermediate dict.
"""

from __future__ import annotations

import base64
import os
import random
import threading
import time
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

import orjson

# 2: a large body field may be null with `<field>_chunks` (upstream_request: `body_chunks`) naming
# chunk lines earlier in the same segment that hold its bytes (toolproxy/record/chunks.py). The
# segment reader puts the bodies back, so readers see the same record as in version 1.
# 3: header values are the wire bytes read as ISO-8859-1 (before, request header values were
# decoded as UTF-8), and text fields that were not valid UTF-8 are listed in extra["latin1_fields"].
RECORD_VERSION = 3

# The key of `extra` that holds the model name sent upstream when the proxy replaced the harness's
# (toolproxy/proxy/modelswap.py): the harness's own stays in `request_body`.
MODEL_SENT = "model_sent"

# The key of `extra` that marks a WebSocket's records (toolproxy/proxy/websocket.py): the
# connection's (`upgrade`: asked, accepted, refused, not offered) and each exchange on it
# (`connection`: the connection record's id, `exchange`: its place on the connection). An
# exchange's response body is the server's messages, each followed by a newline.
WEBSOCKET = "websocket"


def websocket_exchange(rec: dict) -> bool:
    """A record (as read from a segment) of one exchange on a WebSocket, not of its connection."""
    extra = rec.get("extra")
    info = extra.get(WEBSOCKET) if isinstance(extra, dict) else None
    return isinstance(info, dict) and "connection" in info


# The error kinds of an exchange the client side ended before its answer was complete: the client
# hung up (whatever its reason), or the user interrupted the harness while the exchange was in
# flight (Ctrl-C under `toolproxy run` or `study`, which tell their proxy before the harness sees
# the signal: ProxyState.user_interrupted). The second is the user's doing, never a serving failure.
CLIENT_CLOSED = "client_closed"
USER_INTERRUPT = "user_interrupt"

# Seconds added to this process's wall clock wherever it stamps a record (its id, started_at,
# ended_at). For tests only: it stands in for a host whose clock is off, so that tests can show the
# analysis does not depend on the replicas' clocks agreeing (tests/test_replicas.py). Never set it
# in production: the recorded times would be wrong by that much.
CLOCK_OFFSET_ENV = "TOOLPROXY_TEST_CLOCK_OFFSET"


def _clock_offset() -> float:
    try:
        return float(os.environ.get(CLOCK_OFFSET_ENV) or 0.0)
    except ValueError:
        return 0.0


_offset_s = _clock_offset()
_offset_ms = round(_offset_s * 1000)

_id_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def now() -> float:
    """The wall clock records are stamped with (Unix seconds)."""
    return time.time() + _offset_s


def new_id() -> str:
    """A sortable unique id: 48-bit milliseconds + 80 random bits, as 32 lowercase hex digits
    (the layout of a UUIDv7 or ULID, without their version bits).

    Monotonic within a process: ids made in the same millisecond (or after the clock stepped back)
    increment the random part, so `ORDER BY id` is the order one proxy saw its exchanges in. Unique
    across processes and hosts without coordination: two writers collide only if they draw random
    parts within a few counts of each other in the same millisecond (about 2^-70 per pair). Across
    hosts, ids sort by each host's clock, so the analyzer never orders one conversation by them
    alone (analysis/episodes/order.py: causal_order).
    """
    global _last_ms, _last_rand
    ms = time.time_ns() // 1_000_000 + _offset_ms
    with _id_lock:
        if ms <= _last_ms:
            ms = _last_ms
            _last_rand = (_last_rand + 1) & ((1 << 80) - 1)
        else:
            _last_ms = ms
            _last_rand = random.getrandbits(80)
        rand = _last_rand
    return f"{ms:012x}{rand:020x}"


def encode_body(raw: bytes | None) -> tuple[str | None, str | None]:
    """Body bytes -> (text, encoding) so JSON lines stay lossless.

    UTF-8 bodies (nearly all LLM traffic) are kept as text so the segments stay greppable and
    DuckDB can read them directly; anything else is base64 so no byte is lost.
    """
    if raw is None:
        return None, None
    try:
        return raw.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def body_bytes(text: str | None, encoding: str | None) -> bytes | None:
    """The inverse of encode_body."""
    if text is None:
        return None
    if encoding == "base64":
        return base64.b64decode(text)
    return text.encode("utf-8")


@dataclass(slots=True)
class Record:
    """One HTTP exchange through the proxy, whatever happened to it.

    Timestamps are Unix epoch seconds (float); durations are milliseconds. Header lists keep
    order and duplicates as [name, value] pairs, with secret values already redacted.
    Bodies are (text, encoding) pairs made by encode_body.
    """

    id: str
    started_at: float
    kind: str = "exchange"
    v: int = RECORD_VERSION
    ended_at: float | None = None
    # The upstream's time to first byte, and apart from it any wait for a free upstream connection
    # (null when the pool has no limit, so nothing can wait).
    ttfb_ms: float | None = None
    pool_wait_ms: float | None = None
    duration_ms: float | None = None

    run: str | None = None
    episode: str | None = None
    item: str | None = None
    condition: str = "native"
    tags: dict[str, str] = field(default_factory=dict)

    upstream: str = ""
    method: str = ""
    path: str = ""
    query: str = ""
    client_path: str = ""
    request_headers: list[list[str]] = field(default_factory=list)
    request_body: str | None = None
    request_body_encoding: str | None = None
    request_body_size: int | None = None

    upstream_request: dict[str, Any] | None = None
    condition_note: str | None = None

    status: int | None = None
    response_headers: list[list[str]] = field(default_factory=list)
    response_body: str | None = None
    response_body_encoding: str | None = None
    response_complete: bool = False

    client_status: int | None = None
    client_body: str | None = None
    client_body_encoding: str | None = None

    error_kind: str | None = None
    error_message: str | None = None

    extra: dict[str, Any] = field(default_factory=dict)

    def set_error(self, kind: str, message: str) -> None:
        # The first error is the cause; later ones (e.g. the client hanging up after an upstream
        # failure) are consequences and go to extra so nothing is lost.
        if self.error_kind is None:
            self.error_kind, self.error_message = kind, message
        else:
            self.extra.setdefault("later_errors", []).append({"kind": kind, "message": message})


# The kind of a record of MCP traffic (McpRecord): a tool server's messages beside the model's.
MCP = "mcp"


@dataclass(slots=True)
class McpRecord(Record):
    """One exchange with an MCP server (docs/record.md, "MCP records"): over stdio, a JSON-RPC
    request and its response, or one lone message (a notification, a line that is no message);
    over HTTP, one HTTP exchange as any other. A record of its own kind, so the analyzer never
    takes it for an attempt; the HTTP fields are left empty for stdio.

    `mcp` holds what the transport knows: `transport` (stdio, http), `server` (the name the
    agent's configuration gives it), `session` (stdio: one id per server process; http: the
    keyed stand-in of the Mcp-Session-Id), and for stdio `event` (message, start, exit), `from`
    (client, server: who sent the request or lone message), `message` (request, notification,
    response, batch, not_json, not_jsonrpc), `method`, `id` (the JSON-RPC id as sent).
    """

    kind: str = MCP
    mcp: dict[str, Any] = field(default_factory=dict)


class RecordEncodeError(ValueError):
    """A record that cannot be written as a JSON line even after the lossless repair."""


def encode_record(rec: Record, fields: dict[str, Any] | None = None) -> bytes:
    """The record as one JSON line (newline included), never refusing odd text. `fields`, when
    given, is what to write instead of the record itself (all its fields, some replaced).

    JSON text must be valid Unicode, but a client can put any byte in a header or a tag, and
    aiohttp hands such bytes over as lone surrogates. Rather than lose the record, every text
    field that is not valid UTF-8 is stored with one character per original byte (ISO-8859-1) and
    named in extra["latin1_fields"] (e.g. "tags.note"), so `value.encode("latin-1")` gives the
    bytes back. The repair costs nothing on the common path: it runs only after orjson refuses.
    """
    try:
        return orjson.dumps(rec if fields is None else fields, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError as first:
        if fields is None:
            fields = {f.name: getattr(rec, f.name) for f in dataclass_fields(rec)}
        repaired: list[str] = []
        data = {name: _latin1_repair(value, name, repaired) for name, value in fields.items()}
        if repaired:
            data["extra"] = {**data["extra"], "latin1_fields": repaired}
        try:
            return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError as exc:
            raise RecordEncodeError(f"record {rec.id} cannot be stored as JSON: {exc}") from first


def _latin1_repair(value: Any, path: str, repaired: list[str]) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            repaired.append(path)
            return stored_text(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = _latin1_repair(k, f"{path}.{{key}}", repaired) if isinstance(k, str) else k
            out[key] = _latin1_repair(v, f"{path}.{key}", repaired)
        return out
    if isinstance(value, (list, tuple)):
        return [_latin1_repair(v, f"{path}[{i}]", repaired) for i, v in enumerate(value)]
    return value


def stored_text(text: str) -> str:
    """A str as a record line stores it: unchanged when it is valid Unicode, else one character
    per original byte (see encode_record), so it can go into any JSON document."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _original_bytes(text).decode("latin-1")


def _original_bytes(text: str) -> bytes:
    """The bytes a str came from: undecodable bytes arrive as surrogate escapes (U+DC80-U+DCFF);
    any other lone surrogate (e.g. from a JSON "\\ud800" escape) is kept as its UTF-8 form."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
