"""MCP records in the analyzer: each one's rows (analysis.classify.mcp) from a table of cases,
and a real ingest where they sit beside a model's exchanges and never become attempts."""

from __future__ import annotations

import gzip
import time

import orjson
import pytest

from toolproxy.analysis.classify.mcp import mcp_rows
from toolproxy.analysis.lifecycle.ingest import ingest
from toolproxy.analysis.lifecycle.reanalyze import rebuild
from toolproxy.analysis.store.connection import connect, default_db
from toolproxy.record.model import McpRecord, Record, encode_body, new_id
from toolproxy.record.writer import SegmentWriter


def line(doc) -> bytes:
    return orjson.dumps(doc) + b"\n"


def call(rid, name="read_file", arguments=None) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments or {}}}


def result(rid, text="ok", is_error=False) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}], "isError": is_error}}


def stdio(request=None, response=None, *, sender="client", event="message", error=None, **mcp) -> dict:
    rec = McpRecord(id=new_id(), started_at=1000.0, ended_at=1000.5, duration_ms=500.0, run="r", episode="e")
    if request is not None:
        rec.request_body, rec.request_body_encoding = encode_body(request)
    if response is not None:
        rec.response_body, rec.response_body_encoding = encode_body(response)
    if error is not None:
        rec.set_error(*error)
    rec.mcp = {"transport": "stdio", "server": "fs", "session": "s1", "event": event, "from": sender, **mcp}
    return orjson.loads(orjson.dumps(rec))


def http(request: bytes, response: bytes, *, status=200, ctype="application/json", method="POST", marks=None, **kw):
    rec = McpRecord(
        id=new_id(), started_at=1000.0, ended_at=1001.0, duration_ms=1000.0, method=method, path="/mcp", status=status
    )
    rec.request_body, rec.request_body_encoding = encode_body(request)
    rec.response_body, rec.response_body_encoding = encode_body(response)
    rec.request_headers = [["Content-Type", "application/json"]]
    rec.response_headers = [["content-type", ctype], *kw.pop("response_headers", [])]
    if marks:
        rec.extra["piece_ms"] = marks
    for k, v in kw.items():
        setattr(rec, k, v)
    rec.mcp = {"transport": "http", "server": "web", "session": "redacted:1"}
    return orjson.loads(orjson.dumps(rec))


def sse(*docs) -> bytes:
    return b"".join(b"event: message\r\ndata: " + orjson.dumps(d) + b"\r\n\r\n" for d in docs)


PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}

# (case, record, [(sender, message, method, tool, result, error_kind), ...] for its rows)
CASES = [
    (
        "stdio call answered",
        stdio(line(call(3, "read_file", {"path": "/a"})), line(result(3, "text"))),
        [("client", "request", "tools/call", "read_file", "ok", None)],
    ),
    (
        "stdio call, isError result",
        stdio(line(call(4)), line(result(4, "no such file", is_error=True))),
        [("client", "request", "tools/call", "read_file", "tool_error", None)],
    ),
    (
        "stdio call, JSON-RPC error",
        stdio(line(call(5)), line({"jsonrpc": "2.0", "id": 5, "error": {"code": -32602, "message": "bad args"}})),
        [("client", "request", "tools/call", "read_file", "rpc_error", None)],
    ),
    (
        "stdio call cancelled",
        stdio(line(call(6)), error=("cancelled", "the client cancelled it")),
        [("client", "request", "tools/call", "read_file", None, "cancelled")],
    ),
    (
        "stdio line that is no JSON",
        stdio(b"Server running on stdio\n", sender="server", message="not_json"),
        [("server", "not_json", None, None, None, None)],
    ),
    (
        "stdio late response",
        stdio(line(result(9)), sender="server", message="response", unmatched=True),
        [("server", "response", None, None, "ok", None)],
    ),
    (
        "stdio server exit",
        stdio(event="exit", response=b"Traceback...\n", error=("server_crashed", "exited")),
        [(None, None, None, None, None, "server_crashed")],
    ),
    (
        "http: SSE with progress before the answer",
        http(orjson.dumps(call(2)), sse(PROGRESS, result(2)), ctype="text/event-stream"),
        [
            ("client", "request", "tools/call", "read_file", "ok", None),
            ("server", "notification", "notifications/progress", None, None, None),
        ],
    ),
    (
        "http: JSON answer, isError",
        http(orjson.dumps(call(2)), orjson.dumps(result(2, "denied", True))),
        [("client", "request", "tools/call", "read_file", "tool_error", None)],
    ),
    (
        "http: a notification accepted",
        http(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}), b"", status=202),
        [("client", "notification", "notifications/initialized", None, None, None)],
    ),
    (
        "http: refused with no JSON-RPC answer",
        http(orjson.dumps(call(7)), b"Bad Request: no session", status=400, ctype="text/plain"),
        [("client", "request", "tools/call", "read_file", None, "http_400")],
    ),
    (
        "http: the upstream timed out",
        http(orjson.dumps(call(8)), b"", status=None, error_kind="timeout", error_message="no answer"),
        [("client", "request", "tools/call", "read_file", None, "timeout")],
    ),
    (
        "http: a batch",
        http(orjson.dumps([call(1, "a"), call(2, "b")]), orjson.dumps([result(2), result(1)])),
        [
            ("client", "request", "tools/call", "a", "ok", None),
            ("client", "request", "tools/call", "b", "ok", None),
        ],
    ),
    (
        "http: a GET stream of server messages",
        http(b"", sse(PROGRESS, result(4)), method="GET", ctype="text/event-stream"),
        [
            ("server", "notification", "notifications/progress", None, None, None),
            ("server", "response", None, None, "ok", None),
        ],
    ),
    (
        "http: a DELETE ending the session",
        http(b"", b"", method="DELETE"),
        [(None, None, None, None, None, None)],
    ),
    (
        "http: a gzip-encoded answer",
        http(
            orjson.dumps(call(3)),
            gzip.compress(orjson.dumps(result(3))),
            response_headers=[["content-encoding", "gzip"]],
        ),
        [("client", "request", "tools/call", "read_file", "ok", None)],
    ),
]


@pytest.mark.parametrize("case,rec,expected", CASES, ids=[c[0] for c in CASES])
def test_rows_of_a_record(case, rec, expected):
    rows = mcp_rows(rec, "seg", 0)
    got = [(r["sender"], r["message"], r["method"], r["tool"], r["result"], r["error_kind"]) for r in rows]
    assert got == expected
    assert rows[0]["id"] == rec["id"] and len({r["id"] for r in rows}) == len(rows)
    assert all(r["record_id"] == rec["id"] and r["server"] == rec["mcp"]["server"] for r in rows)


def test_what_a_row_keeps_of_a_call():
    rec = stdio(line(call(3, "read_file", {"path": "/a"})), line(result(3, "gone", True)))
    (row,) = mcp_rows(rec, "seg", 7)
    assert orjson.loads(row["arguments"]) == {"path": "/a"} and row["rpc_id"] == "3"
    assert row["error_message"] == "gone" and row["duration_ms"] == 500.0
    assert (row["segment"], row["segment_offset"], row["event"]) == ("seg", 7, "message")


def test_an_sse_event_is_dated_by_the_piece_it_came_in():
    body = sse(PROGRESS, result(2))
    first = len(sse(PROGRESS))
    rec = http(orjson.dumps(call(2)), body, ctype="text/event-stream", marks=[[first, 10.0], [len(body), 750.0]])
    request, progress = mcp_rows(rec, "seg", 0)
    assert request["duration_ms"] == 750.0 and request["ended_at"] == pytest.approx(1000.75)
    assert progress["started_at"] == pytest.approx(1000.01)


def _model_exchange(run: str) -> Record:
    rec = Record(id=new_id(), started_at=time.time(), run=run, episode="1", method="POST", path="/v1/chat/completions")
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    rec.request_body, rec.request_body_encoding = encode_body(orjson.dumps(req))
    rec.status = rec.client_status = 200
    rec.response_headers = [["content-type", "application/json"]]
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}
    rec.response_body, rec.response_body_encoding = encode_body(orjson.dumps(reply))
    rec.response_complete = True
    return rec


def _mcp_record(run: str) -> McpRecord:
    rec = McpRecord(id=new_id(), started_at=time.time(), run=run, episode="1", upstream="stdio:fs")
    rec.request_body, rec.request_body_encoding = encode_body(line(call(1)))
    rec.response_body, rec.response_body_encoding = encode_body(line(result(1)))
    rec.mcp = {"transport": "stdio", "server": "fs", "session": "s", "event": "message", "from": "client"}
    rec.mcp.update(message="request", method="tools/call", id=1)
    return rec


def test_mcp_records_load_as_their_own_rows_never_as_attempts(tmp_path):
    writer = SegmentWriter(tmp_path, window=0.01)
    writer.start()
    for rec in (_model_exchange("r1"), _mcp_record("r1"), _mcp_record("r1")):
        writer.submit(rec)
    writer.close()
    con = connect(default_db(tmp_path))
    s = ingest(con, tmp_path)
    assert s.new_exchanges == 1 and s.mcp_exchanges == 2
    assert con.execute("SELECT count(*) FROM exchanges").fetchone()[0] == 1
    assert con.execute("SELECT n_exchanges, n_turns FROM runs WHERE run = 'r1'").fetchone() == (1, 1)
    assert con.execute("SELECT count(*), min(tool), min(result) FROM mcp_exchanges").fetchone() == (
        2,
        "read_file",
        "ok",
    )
    ingest(con, tmp_path)  # nothing new: nothing twice
    assert con.execute("SELECT count(*) FROM mcp_exchanges").fetchone()[0] == 2
    con.execute("UPDATE mcp_exchanges SET result = NULL, analyzer_version = 0")
    rebuild(con, None, exchanges=True, data_dir=tmp_path)  # a re-analyze makes the rows again, from the records
    assert con.execute("SELECT count(*), min(result) FROM mcp_exchanges").fetchone() == (2, "ok")
