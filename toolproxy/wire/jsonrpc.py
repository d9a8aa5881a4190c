"""JSON-RPC 2.0 as MCP carries it: what one message is, where the messages of an HTTP body are,
and a reply's id set to the request it now answers.

MCP sends one JSON-RPC message per line over stdio, and over HTTP one message (or, in the
2025-03-26 revision, a batch) per POST body, answered by a JSON body or an SSE stream whose
`data:` events are messages. The stdio relay, playback and the analyzer read messages here, so
they cannot disagree about which message was a request, which its response, and which line no
message at all.

An id is compared as its JSON text (`id_key`): `1` and `"1"` are different ids, as JSON-RPC says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from toolproxy.wire.framing import SSEFramer

REQUEST = "request"
NOTIFICATION = "notification"
RESPONSE = "response"
BATCH = "batch"
# A line that is no JSON, and JSON that is no JSON-RPC message (no method, no result or error).
NOT_JSON = "not_json"
NOT_JSONRPC = "not_jsonrpc"
KINDS = (REQUEST, NOTIFICATION, RESPONSE, BATCH, NOT_JSON, NOT_JSONRPC)
# The notification that cancels a request still in flight (its params name the request's id).
CANCELLED = "notifications/cancelled"
TOOLS_CALL = "tools/call"


@dataclass(frozen=True, slots=True)
class Message:
    """One message read: its kind, method (requests and notifications), id as JSON text
    (requests and responses), whether a response is a JSON-RPC error, and the parsed document."""

    kind: str
    method: str | None = None
    id_key: str | None = None
    is_error: bool = False
    doc: Any = None


def id_key(value: Any) -> str:
    """An id as compared: its JSON text."""
    return orjson.dumps(value).decode()


def read_message(raw: bytes | str) -> Message:
    """What one framed message is (a stdio line, an HTTP body, an SSE event's data)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Message(NOT_JSON)
    return classify(doc)


def classify(doc: Any) -> Message:
    """What a parsed message is."""
    if isinstance(doc, list):
        return Message(BATCH, doc=doc)
    if not isinstance(doc, dict):
        return Message(NOT_JSONRPC, doc=doc)
    method = doc.get("method")
    if isinstance(method, str):
        if "id" in doc:
            return Message(REQUEST, method, id_key(doc["id"]), doc=doc)
        return Message(NOTIFICATION, method, doc=doc)
    if "id" in doc and ("result" in doc or "error" in doc):
        return Message(RESPONSE, None, id_key(doc["id"]), "error" in doc, doc)
    return Message(NOT_JSONRPC, doc=doc)


def cancelled_id(msg: Message) -> str | None:
    """The id (as JSON text) a `notifications/cancelled` names, or None for any other message."""
    if msg.kind != NOTIFICATION or msg.method != CANCELLED:
        return None
    params = msg.doc.get("params")
    if not isinstance(params, dict) or "requestId" not in params:
        return None
    return id_key(params["requestId"])


@dataclass(frozen=True, slots=True)
class Framed:
    """A message found in an HTTP body: its bytes, and when it arrived (ms after the exchange
    started, from the record's piece marks; None when the body came in one piece)."""

    raw: bytes
    at_ms: float | None


def body_messages(body: bytes, content_type: str | None, marks: list[tuple[int, float]] | None = None) -> list[Framed]:
    """The messages of an HTTP body in order: one JSON document (a message or a batch), or the
    `data:` of each SSE event (events of another name than `message` are not messages: the old
    HTTP+SSE transport's `endpoint` event). `marks`: (end offset, ms) of each piece as recorded,
    which date the events of a stream."""
    ct = (content_type or "").lower()
    stripped = body.lstrip()
    if "text/event-stream" not in ct and not stripped.startswith((b"data:", b"event:", b"id:", b":", b"retry:")):
        return [Framed(body, None)] if stripped else []
    framer = SSEFramer()
    out: list[Framed] = []
    start = 0
    for end, ms in marks or [(len(body), None)]:
        for event, data in framer.feed(body[start:end]):
            if event in (None, "message") and data.strip():
                out.append(Framed(data, ms))
        start = max(start, end)
    last = marks[-1][1] if marks else None
    if start < len(body):
        for event, data in framer.feed(body[start:]):
            if event in (None, "message") and data.strip():
                out.append(Framed(data, last))
    for event, data in framer.close():
        if event in (None, "message") and data.strip():
            out.append(Framed(data, last))
    return out


def with_id(raw: bytes, recorded: str, wanted: Any) -> bytes:
    """A recorded response line or body answered to another id: the response whose id is
    `recorded` (JSON text) gets `wanted` instead, every other byte as recorded. A JSON body or
    line is written again only when the ids differ; in an SSE body each event's data is."""
    if id_key(wanted) == recorded:
        return raw
    stripped = raw.lstrip()
    if stripped.startswith((b"{", b"[")):
        return _json_with_id(raw, recorded, wanted)
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:]
            lead = b" " if data.startswith(b" ") else b""
            line = (
                b"data:"
                + lead
                + _json_with_id(data[len(lead) :].rstrip(b"\r"), recorded, wanted)
                + (b"\r" if data.endswith(b"\r") else b"")
            )
        out.append(line)
    return b"\n".join(out)


def _json_with_id(raw: bytes, recorded: str, wanted: Any) -> bytes:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    changed = False
    for item in doc if isinstance(doc, list) else [doc]:
        if isinstance(item, dict) and "method" not in item and "id" in item and id_key(item["id"]) == recorded:
            item["id"] = wanted
            changed = True
    if not changed:
        return raw
    tail = raw[len(raw.rstrip(b"\r\n")) :]
    return orjson.dumps(doc) + tail
