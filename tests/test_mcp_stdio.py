"""`toolproxy mcp -- CMD`: the stdio relay between the mcp SDK's client and real servers (the
SDK's MCPServer, a fastmcp server, a hand-written one), every byte compared on both sides of
the wrapper and against a run without it, and what the records say of each request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcpprocs import SERVER, mcp_records
from mcpprocs import client as sdk_client

pytest.importorskip("mcp")

HERE = Path(__file__).resolve().parent
RAW_SERVER = [sys.executable, str(HERE / "mcpraw.py")]
FAST_SERVER = [sys.executable, str(HERE / "fastmcpserver.py")]
TAP = [sys.executable, str(HERE / "mcptap.py")]


def client(mode: str, calls: list, server: list[str], env: dict | None = None) -> list[dict]:
    return sdk_client(mode, calls, server=server, env=env)


def wrapper(data: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "toolproxy.cli", "mcp", "--data", str(data), *args]


def messages(records: list[dict]) -> list[dict]:
    return [r for r in records if r["mcp"].get("event") == "message"]


def tapped(log: Path) -> tuple[bytes, bytes]:
    return Path(f"{log}.in").read_bytes(), Path(f"{log}.out").read_bytes()


CALLS = [["add", {"a": 1, "b": 2}, None], ["fail", {"reason": "boom"}, None], ["add", {"a": 40, "b": 2}, None]]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("server", [SERVER, FAST_SERVER], ids=["mcp-sdk", "fastmcp"])
def test_every_byte_passes_unchanged_both_ways(tmp_path, mode, server):
    if server is FAST_SERVER:
        pytest.importorskip("fastmcp")
    direct = client(mode, CALLS, [*TAP, str(tmp_path / "direct"), "--", *server])
    data = tmp_path / "data"
    wrapped = client(
        mode,
        CALLS,
        [
            *TAP,
            str(tmp_path / "agent"),
            "--",
            *wrapper(data, "--name", "t"),
            "--",
            *TAP,
            str(tmp_path / "server"),
            "--",
            *server,
        ],
    )
    assert wrapped == direct
    assert [c.get("is_error") for c in wrapped[1:]] == [False, True, False]
    agent_side, server_side = tapped(tmp_path / "agent"), tapped(tmp_path / "server")
    assert agent_side == server_side  # what the agent sent is what the server got, and back
    assert agent_side == tapped(tmp_path / "direct")  # and the same as without the wrapper
    # The records hold the same bytes: each request's line and its response's line, as sent.
    recs = messages(mcp_records(data))
    sent_in = b"".join(r["request_body"].encode() for r in recs if r["mcp"]["from"] == "client")
    assert sent_in == agent_side[0]
    answers = [r["response_body"].encode() for r in recs if r.get("response_body")]
    assert b"".join(answers) == agent_side[1]


def test_records_pair_each_request_with_its_response(tmp_path):
    data = tmp_path / "data"
    got = client("legacy", CALLS, wrapper(data, "--run", "r1", "--name", "calc", "--tag", "episode=7", "--", *SERVER))
    assert [c["text"] for c in got[1:]] == ["3", "Error executing tool fail", "42"]
    recs = mcp_records(data)
    assert {r["run"] for r in recs} == {"r1"} and {r["episode"] for r in recs} == {"7"}
    assert {r["mcp"]["server"] for r in recs} == {"calc"} and len({r["mcp"]["session"] for r in recs}) == 1
    events = [r["mcp"]["event"] for r in recs]
    assert events[0] == "start" and events[-1] == "exit"
    start, end = recs[0], recs[-1]
    assert start["mcp"]["command"] == SERVER and isinstance(start["mcp"]["pid"], int)
    assert end["error_kind"] is None and end["mcp"]["client_closed_first"] is True
    calls = [r for r in messages(recs) if r["mcp"].get("method") == "tools/call"]
    assert [r["mcp"]["id"] for r in calls] == [3, 4, 5]
    for r in calls:
        req, resp = json.loads(r["request_body"]), json.loads(r["response_body"])
        assert req["id"] == resp["id"] == r["mcp"]["id"]
        assert r["duration_ms"] >= r["ttfb_ms"] >= 0 and r["ended_at"] >= r["started_at"]
        assert r["error_kind"] is None and r["response_complete"] is True
    assert [json.loads(r["response_body"])["result"]["isError"] for r in calls] == [False, True, False]
    lone = [r for r in messages(recs) if r["mcp"]["message"] == "notification"]
    assert [r["mcp"]["method"] for r in lone] == ["notifications/initialized"] and lone[0]["response_body"] is None
    assert end["mcp"]["by_kind"] == {"request": 5, "response": 5, "notification": 1}


def test_a_hang_a_crash_and_the_stderr_left_behind(tmp_path):
    data = tmp_path / "data"
    got = client(
        "legacy",
        [["add", {"a": 1, "b": 1}, None], ["hang", {}, 2], ["add", {"a": 2, "b": 2}, None], ["crash", {}, None]],
        wrapper(data, "--name", "t", "--", *SERVER),
    )
    assert got[2]["exception"].endswith("timed out") and got[3]["text"] == "4"
    assert "closed" in got[4]["exception"].lower()
    recs = mcp_records(data)
    calls = {r["mcp"]["id"]: r for r in messages(recs) if r["mcp"].get("method") == "tools/call"}
    hung = calls[4]
    assert hung["error_kind"] == "cancelled" and hung["response_body"] is None
    assert json.loads(hung["request_body"])["params"]["name"] == "hang"
    assert hung["duration_ms"] >= 1500  # recorded when the client gave up, not at the end
    crashed = calls[6]
    assert crashed["error_kind"] == "server_exited" and "status 3" in crashed["error_message"]
    end = recs[-1]
    assert end["mcp"]["event"] == "exit" and end["mcp"]["returncode"] == 3
    assert end["error_kind"] == "server_crashed" and end["mcp"]["client_closed_first"] is False
    assert "crashed on purpose" in end["response_body"]  # the server's last words, for the debugging


def test_the_wrapper_exits_with_the_servers_status_and_a_missing_server_is_said(tmp_path):
    data = tmp_path / "data"
    init = (
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
        b'"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n'
    )
    call = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"crash","arguments":{}}}\n'
    # The call is sent once the handshake is answered: sent together, the server may die before it answers.
    proc = subprocess.Popen(
        wrapper(data, "--", *SERVER), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    proc.stdin.write(init + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    proc.stdin.flush()
    answered = proc.stdout.readline()
    proc.stdin.write(call)
    proc.stdin.close()
    rest = proc.stdout.read()
    assert proc.wait(120) == 3
    assert answered.startswith(b'{"jsonrpc":"2.0","id":1,"result":') and rest == b""  # no answer to the crash
    missing = subprocess.run(
        wrapper(data, "--name", "gone", "--", "no-such-mcp-server"), input=init, capture_output=True, timeout=60
    )
    assert missing.returncode == 127 and missing.stdout == b""
    assert b"cannot start the MCP server no-such-mcp-server" in missing.stderr
    failed = [r for r in mcp_records(data) if r["mcp"]["server"] == "gone"]
    assert failed[0]["error_kind"] == "spawn_failed"


def test_lines_that_are_no_message_pass_and_are_recorded(tmp_path):
    data = tmp_path / "data"
    got = client(
        "legacy",
        [["echo", {"text": "hi"}, None], ["noise", {}, None]],
        wrapper(data, "--name", "raw", "--", *RAW_SERVER),
    )
    assert [c.get("text") for c in got[1:]] == ["hi", "noisy"]
    recs = messages(mcp_records(data))
    junk = [r for r in recs if r["mcp"]["message"] == "not_json"]
    assert [r["request_body"] for r in junk] == [
        "raw server ready (a log line on stdout)\n",
        "debug: noise was called\n",
    ]
    assert {r["mcp"]["from"] for r in junk} == {"server"}
    calls = [r for r in recs if r["mcp"].get("method") == "tools/call"]
    assert [json.loads(r["response_body"])["result"]["content"][0]["text"] for r in calls] == ["hi", "noisy"]


def test_secrets_of_the_server_never_reach_disk(tmp_path):
    data = tmp_path / "data"
    token = "ghp_s3cretTokenValue0123456789"
    env = {**os.environ, "DEMO_TOKEN": token}
    got = client(
        "legacy",
        [["secret", {}, None]],
        wrapper(data, "--name", "s", "--", *SERVER, "--api-key", "sk-commandlinekey123", f"--token={token}"),
        env=env,
    )
    assert got[1]["text"] == token  # the agent gets it as the server sent it
    on_disk = b"".join(p.read_bytes() for p in (data / "segments").iterdir())
    for secret in (token.encode(), b"sk-commandlinekey123"):
        assert secret not in on_disk
    recs = mcp_records(data)
    command = recs[0]["mcp"]["command"]
    assert command[-2].startswith("redacted:") and command[-1].startswith("--token=redacted:")
    call = next(r for r in messages(recs) if r["mcp"].get("method") == "tools/call")
    assert "redacted:" in call["response_body"] and "redacted:" in recs[-1]["response_body"]
