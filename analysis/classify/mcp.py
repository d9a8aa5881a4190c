"""One MCP record -> its rows of `mcp_exchanges`: each JSON-RPC request with its response, and
each lone message, whatever the transport. Pure, like the rest of the per-record stage.

An MCP record is never an attempt: it holds no model's output, so it never becomes a turn or
enters a model's metric. Over stdio the relay already paired a request with its response (one
record, one row). Over HTTP a record is one HTTP exchange: its request body holds the client's
message (or a batch), its response body the server's answer (JSON, or an SSE stream whose events
may carry progress and logging notifications and the server's own requests before the response),
and a GET holds a stream of server messages. Each request here is paired with the response to
its id in the same record; what has no partner in its record (the older HTTP+SSE transport
answers on the GET stream) is a row of its own.

A row's `result` says what a request got: `ok`, `tool_error` (a result with `isError`: the
JSON-RPC exchange succeeded, the tool failed), `rpc_error` (a JSON-RPC error), or null with
`error_kind` saying why there was no answer: cancelled, server_exited, client_closed, stopped;
over HTTP the proxy's own kinds (timeout, upstream_closed, connect ...) or `http_<status>` for an
HTTP error with no JSON-RPC answer.
"""

from __future__ import annotations

from typing import Any

import orjson

from toolproxy.analysis.classify.bodies import decode_body, header
from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.record.pacing import EXTRA_KEY as PIECE_MS
from toolproxy.record.pacing import read_marks
from toolproxy.wire import jsonrpc

OK, TOOL_ERROR, RPC_ERROR = "ok", "tool_error", "rpc_error"
RESULTS = (OK, TOOL_ERROR, RPC_ERROR)
_SHOWN = 500  # characters of an error's text kept in a row
# A row's event: a stdio message or lifecycle (message, start, exit), or an HTTP exchange that held no
# message: a GET stream (stream), the client ending its session (end), anything else (http).
HTTP_EVENTS = {"GET": "stream", "DELETE": "end"}


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, default=str).decode()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text[:_SHOWN]


def outcome(doc: Any) -> tuple[str | None, int | None, str | None]:
    """(result, JSON-RPC error code, error text) of a response document."""
    if not isinstance(doc, dict):
        return None, None, None
    error = doc.get("error")
    if error is not None:
        code = error.get("code") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        return RPC_ERROR, code if type(code) is int and -(1 << 31) <= code < (1 << 31) else None, _text(message)
    result = doc.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        content = result.get("content")
        texts = (
            [c.get("text") for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)]
            if isinstance(content, list)
            else []
        )
        return TOOL_ERROR, None, _text(" ".join(texts) if texts else result.get("content"))
    return OK, None, None


def _call(msg: jsonrpc.Message) -> tuple[str | None, str | None]:
    """(tool name, arguments as JSON) of a tools/call request."""
    if msg.method != jsonrpc.TOOLS_CALL:
        return None, None
    params = msg.doc.get("params")
    if not isinstance(params, dict):
        return None, None
    name = params.get("name")
    return (name if isinstance(name, str) else None), _json(params.get("arguments"))


class _Rows:
    """The rows of one record, with what they share."""

    def __init__(self, rec: dict[str, Any], segment: str, offset: int) -> None:
        mcp = rec.get("mcp") if isinstance(rec.get("mcp"), dict) else {}
        self.rec, self.mcp = rec, mcp
        self.base = {
            "record_id": rec["id"],
            "run": rec.get("run"),
            "episode": rec.get("episode"),
            "item": rec.get("item"),
            "tags": _json(rec.get("tags") or {}),
            "server": mcp.get("server") if isinstance(mcp.get("server"), str) else None,
            "transport": mcp.get("transport") if isinstance(mcp.get("transport"), str) else None,
            "session": mcp.get("session") if isinstance(mcp.get("session"), str) else None,
            "status": rec.get("status"),
            "segment": segment,
            "segment_offset": offset,
            "analyzer_version": ANALYZER_VERSION,
        }
        self.out: list[dict[str, Any]] = []

    def add(self, **fields: Any) -> None:
        n = len(self.out)
        row = {
            "id": self.base["record_id"] if n == 0 else f"{self.base['record_id']}.{n}",
            **self.base,
            "event": "message",
            "sender": None,
            "message": None,
            "method": None,
            "rpc_id": None,
            "tool": None,
            "arguments": None,
            "started_at": self.rec.get("started_at"),
            "ended_at": self.rec.get("ended_at"),
            "duration_ms": None,
            "result": None,
            "error_kind": None,
            "error_code": None,
            "error_message": None,
            "request_bytes": None,
            "response_bytes": None,
        }
        row.update(fields)
        self.out.append(row)

    def message(self, sender: str, msg: jsonrpc.Message, size: int, **fields: Any) -> None:
        tool, arguments = _call(msg) if msg.kind == jsonrpc.REQUEST else (None, None)
        self.add(
            sender=sender,
            message=msg.kind,
            method=msg.method,
            rpc_id=msg.id_key,
            tool=tool,
            arguments=arguments,
            request_bytes=size,
            **fields,
        )


def mcp_rows(rec: dict[str, Any], segment: str, offset: int) -> list[dict[str, Any]]:
    """The `mcp_exchanges` rows of one checked MCP record."""
    rows = _Rows(rec, segment, offset)
    if rows.mcp.get("transport") == "http":
        _http(rows)
    else:
        _stdio(rows)
    return rows.out


def _body(rec: dict[str, Any], which: str) -> bytes | None:
    """A body's bytes as they were sent: inflated when an HTTP exchange compressed it."""
    headers = rec.get("request_headers" if which == "request" else "response_headers")
    raw, _ = decode_body(
        rec.get(f"{which}_body"), rec.get(f"{which}_body_encoding"), header(headers, "content-encoding")
    )
    return raw


def _stdio(rows: _Rows) -> None:
    rec, mcp = rows.rec, rows.mcp
    event = mcp.get("event", "message")
    if event != "message":
        stderr = _body(rec, "response")
        rows.add(
            event=event,
            error_kind=rec.get("error_kind"),
            error_message=_text(rec.get("error_message")),
            response_bytes=len(stderr) if stderr else None,
        )
        return
    request = _body(rec, "request")
    response = _body(rec, "response")
    msg = jsonrpc.read_message(request) if request is not None else jsonrpc.Message(mcp.get("message") or "")
    fields: dict[str, Any] = {
        "duration_ms": rec.get("duration_ms"),
        "error_kind": rec.get("error_kind"),
        "error_message": _text(rec.get("error_message")),
    }
    if response is not None:
        answer = jsonrpc.read_message(response)
        result, code, text = outcome(answer.doc)
        fields.update(result=result, error_code=code, response_bytes=len(response))
        if text is not None:
            fields["error_message"] = text
    elif msg.kind == jsonrpc.RESPONSE:
        result, code, text = outcome(msg.doc)
        fields.update(result=result, error_code=code, error_message=text)
    size = len(request) if request is not None else rec.get("request_body_size")
    rows.message(mcp.get("from"), msg, size, **fields)


def _http(rows: _Rows) -> None:
    rec = rows.rec
    request = _body(rec, "request") or b""
    response = _body(rec, "response") or b""
    extra = rec.get("extra") if isinstance(rec.get("extra"), dict) else {}
    try:
        marks = read_marks(extra[PIECE_MS]) if PIECE_MS in extra else None
    except ValueError:
        marks = None
    sent = _messages(jsonrpc.body_messages(request, header(rec.get("request_headers"), "content-type")))
    got = _messages(jsonrpc.body_messages(response, header(rec.get("response_headers"), "content-type"), marks))
    status = rec.get("status")
    if status is not None and status >= 400:  # an HTTP error's own text is no message of the server's
        got = [(m, f) for m, f in got if m.kind not in (jsonrpc.NOT_JSON, jsonrpc.NOT_JSONRPC)]
    answers = {m.id_key: (m, f) for m, f in got if m.kind == jsonrpc.RESPONSE}
    started = rec.get("started_at")
    for msg, framed in sent:
        if msg.kind != jsonrpc.REQUEST:
            rows.message("client", msg, len(framed.raw))
            continue
        fields: dict[str, Any] = {}
        paired = answers.pop(msg.id_key, None)
        if paired is not None:
            answer, at = paired
            result, code, text = outcome(answer.doc)
            at_ms = at.at_ms if at.at_ms is not None else rec.get("duration_ms")
            fields.update(
                result=result,
                error_code=code,
                error_message=text,
                response_bytes=len(at.raw),
                duration_ms=at_ms,
                ended_at=started + at_ms / 1000.0 if started is not None and at_ms is not None else rec.get("ended_at"),
            )
        else:
            kind = rec.get("error_kind")
            if kind is None and status is not None and status >= 400:
                kind = f"http_{status}"
            elif kind is None and status == 202:
                kind = None  # answered on another stream (HTTP+SSE): joined by id afterwards
            fields.update(
                duration_ms=rec.get("duration_ms"),
                error_kind=kind,
                error_message=_text(
                    rec.get("error_message") or (response[:_SHOWN].decode("utf-8", "replace") if kind else None)
                ),
            )
        rows.message("client", msg, len(framed.raw), **fields)
    for msg, framed in got:
        if msg.kind == jsonrpc.RESPONSE and msg.id_key not in answers:
            continue  # paired above
        at_ms = framed.at_ms
        fields = {"started_at": started + at_ms / 1000.0 if started is not None and at_ms is not None else started}
        if msg.kind == jsonrpc.RESPONSE:
            result, code, text = outcome(msg.doc)
            fields.update(result=result, error_code=code, error_message=text)
        rows.message("server", msg, len(framed.raw), **fields)
    if not rows.out:  # a GET stream that carried no message, a DELETE ending the session, a refusal
        failed = status is not None and status >= 400
        rows.add(
            event=HTTP_EVENTS.get(rec.get("method") or "", "http"),
            error_kind=rec.get("error_kind") or (f"http_{status}" if failed else None),
            error_message=_text(rec.get("error_message")),
            duration_ms=rec.get("duration_ms"),
        )


def _messages(framed: list[jsonrpc.Framed]) -> list[tuple[jsonrpc.Message, jsonrpc.Framed]]:
    out = []
    for f in framed:
        msg = jsonrpc.read_message(f.raw)
        if msg.kind == jsonrpc.BATCH:
            for item in msg.doc:
                out.append((jsonrpc.classify(item), jsonrpc.Framed(orjson.dumps(item), f.at_ms)))
        else:
            out.append((msg, f))
    return out
