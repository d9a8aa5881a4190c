"""`toolproxy mcp --upstream URL`: the mcp SDK's Streamable HTTP and HTTP+SSE servers behind the
proxy, byte for byte against talking to them directly, recorded as the server's MCP records and
read by the analyzer into calls and their results."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from mcpprocs import client, http_server, mcp_proxy, mcp_records

pytest.importorskip("mcp")

ACCEPT = "application/json, text/event-stream"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
MESSAGES = [
    INIT,
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 2, "b": 3}}},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "fail", "arguments": {"reason": "no"}}},
    {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "nope", "arguments": {}}},
]


def post_all(url: str) -> list[tuple[int, str, bytes]]:
    """Each message POSTed as a client would, raw: (status, content type, body) of each answer."""
    out = []
    for msg in MESSAGES:
        req = urllib.request.Request(
            url,
            data=json.dumps(msg).encode(),
            headers={
                "Content-Type": "application/json",
                "Accept": ACCEPT,
                "MCP-Protocol-Version": "2025-06-18",
                "Authorization": "Bearer mcp-secret-token-123456",
            },
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            out.append((r.status, r.headers.get("Content-Type"), r.read()))
    return out


def test_stateless_streamable_http_byte_for_byte(tmp_path):
    with http_server("stateless", "json") as upstream:
        direct = post_all(upstream + "/mcp")
        proxy = mcp_proxy(upstream, tmp_path / "data", "--name", "calc", "--run", "h1")
        try:
            through = post_all(proxy.url + "/t/episode=2/mcp")
        finally:
            proxy.stop()
    assert through == direct
    assert [s for s, _, _ in through] == [200, 202, 200, 200, 200]
    recs = mcp_records(tmp_path / "data")
    assert len(recs) == 5 and {r["run"] for r in recs} == {"h1"} and {r["episode"] for r in recs} == {"2"}
    assert all(r["mcp"]["transport"] == "http" and r["mcp"]["server"] == "calc" for r in recs)
    assert [r["response_body"].encode() for r in recs] == [body for _, _, body in direct]
    auth = [v for r in recs for k, v in r["request_headers"] if k.lower() == "authorization"]
    assert len(auth) == 5 and all(v.startswith("redacted:") for v in auth)
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "data" / "segments").iterdir())
    assert b"mcp-secret-token-123456" not in on_disk
    # The analyzer reads the calls out of the HTTP bodies.
    done = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "analyze", "--data", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "sql",
            "--data",
            str(tmp_path / "data"),
            "--format",
            "json",
            "SELECT tool, result, error_code FROM mcp_exchanges WHERE method = 'tools/call' ORDER BY rpc_id",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(rows.stdout) == [
        {"tool": "add", "result": "ok", "error_code": None},
        {"tool": "fail", "result": "tool_error", "error_code": None},
        {"tool": "nope", "result": "tool_error", "error_code": None},
    ]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_sdk_client_through_the_proxy_gets_what_it_gets_directly(tmp_path, mode):
    calls = [["add", {"a": 1, "b": 2}, None], ["progress", {}, None], ["fail", {"reason": "x"}, None]]
    with http_server() as upstream:
        direct = client(mode, calls, url=upstream + "/mcp")
        proxy = mcp_proxy(upstream, tmp_path / "data", "--name", "web")
        try:
            through = client(mode, calls, url=proxy.url + "/mcp")
        finally:
            proxy.stop()
    assert through == direct
    recs = mcp_records(tmp_path / "data")
    sessions = {r["mcp"]["session"] for r in recs}
    if mode == "legacy":  # one session, named in every exchange by the same stand-in, never in clear
        assert len(sessions) == 1 and next(iter(sessions)).startswith("redacted:")
    posted = [json.loads(r["request_body"]) for r in recs if r["method"] == "POST"]
    assert [m["params"]["name"] for m in posted if m.get("method") == "tools/call"] == ["add", "progress", "fail"]


def test_the_older_http_sse_transport(tmp_path):
    calls = [["add", {"a": 5, "b": 6}, None]]
    with http_server("sse") as upstream:
        proxy = mcp_proxy(upstream, tmp_path / "data", "--name", "old")
        try:
            got = client("legacy", calls, sse=proxy.url + "/sse")
        finally:
            proxy.stop()
    assert got[1]["text"] == "11"
    recs = mcp_records(tmp_path / "data")
    stream = [r for r in recs if r["method"] == "GET"]
    assert len(stream) == 1 and "event: endpoint" in stream[0]["response_body"]
    assert '"text":"11"' in stream[0]["response_body"].replace(" ", "")  # the answer came on the stream
    posts = [r for r in recs if r["method"] == "POST"]
    assert {r["status"] for r in posts} == {202} and len({r["mcp"]["session"] for r in posts}) == 1
    # The session the endpoint event names is on disk as the POSTs name it: by its stand-in, never in clear.
    stand_in = posts[0]["mcp"]["session"]
    assert stand_in.startswith("redacted:") and {r["query"] for r in posts} == {f"session_id={stand_in}"}
    assert f"data: /messages/?session_id={stand_in}\r\n" in stream[0]["response_body"]


def _post(url: str, doc: dict | bytes, **headers: str) -> tuple[int, dict, bytes]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", "Accept": ACCEPT, **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_proxy_admits_limits_and_logs_as_serve_does(tmp_path):
    """`mcp --upstream` is serve: its token, Host check and body limit refuse before the server is
    reached, each refusal counted; its log lines name no token and no session, and show no traceback."""
    token = "proxy-token-0123456789abcdef"
    with http_server("json") as upstream:
        proxy = mcp_proxy(upstream, tmp_path / "data", "--name", "calc", "--auth-token", token, "--max-body", "4KiB")
        try:
            url = proxy.url + "/mcp"
            no_token = _post(url, INIT)
            wrong_host = _post(url, INIT, **{"X-Toolproxy-Token": token, "Host": "evil.example"})
            too_large = _post(url, b'{"pad":"' + b"x" * 8192 + b'"}', **{"X-Toolproxy-Token": token})
            status, headers, body = _post(url, INIT, **{"X-Toolproxy-Token": token})
            session = headers.get("mcp-session-id") or headers.get("Mcp-Session-Id")
            call = {**MESSAGES[2], "id": 2}
            answered = _post(url, call, **{"X-Toolproxy-Token": token, "Mcp-Session-Id": session})
            stats_req = urllib.request.Request(proxy.url + "/_toolproxy/stats", headers={"X-Toolproxy-Token": token})
            with urllib.request.urlopen(stats_req, timeout=10) as r:
                stats = json.loads(r.read())
        finally:
            proxy.stop()
    assert (no_token[0], wrong_host[0], too_large[0]) == (401, 403, 413)
    assert status == 200 and session and b'"protocolVersion"' in body
    assert answered[0] == 200 and json.loads(answered[2])["result"]["content"][0]["text"] == "5"
    refused = stats["refused"]["by_kind"]
    assert (refused["unauthorized"], refused["host_refused"]) == (1, 1)
    # Every exchange is recorded as the server's, the refused ones too (in the refusals' segments).
    recs = mcp_records(tmp_path / "data")
    assert {r["mcp"]["server"] for r in recs} == {"calc"}
    assert sorted((r["client_status"], r["error_kind"] or "") for r in recs) == [
        (200, ""),
        (200, ""),
        (401, "unauthorized"),
        (403, "host_refused"),
        (413, "body_too_large"),
    ]
    sessions = {r["mcp"]["session"] for r in recs if r["client_status"] == 200}
    assert len(sessions) == 1 and next(iter(sessions)).startswith("redacted:")
    log = proxy.output()
    assert "POST /mcp" in log and "Traceback" not in log
    assert token not in log and session not in log
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "data" / "segments").iterdir())
    assert token.encode() not in on_disk and session.encode() not in on_disk
