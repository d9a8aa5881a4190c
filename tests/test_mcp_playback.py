"""MCP playback: a recorded server answering the mcp SDK's client again without the server,
over stdio (`toolproxy mcp --playback`) and Streamable HTTP (`toolproxy playback`); misses as
clear errors, or sent to the real server and recorded into the run."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from mcpprocs import SERVER, client, http_server, mcp_proxy, mcp_records, playback

pytest.importorskip("mcp")


def wrapper(data, *args: str) -> list[str]:
    return [sys.executable, "-m", "toolproxy.cli", "mcp", "--data", str(data), *args]


RECORDED = [["add", {"a": 1, "b": 2}, None], ["fail", {"reason": "boom"}, None]]
# Asked in another order (so under other JSON-RPC ids), and one call never recorded.
ASKED = [["fail", {"reason": "boom"}, None], ["add", {"a": 1, "b": 2}, None], ["add", {"a": 9, "b": 9}, None]]


def test_a_stdio_server_played_back_offline(tmp_path):
    data = tmp_path / "data"
    recorded = client("legacy", RECORDED, server=wrapper(data, "--run", "rec", "--name", "calc", "--", *SERVER))
    played = client("legacy", ASKED, server=wrapper(data, "--playback", "rec", "--name", "calc"))
    assert played[0] == recorded[0]  # tools/list, as recorded
    assert played[1] == recorded[2] and played[2] == recorded[1]  # each answer under the id it was asked with
    assert "toolproxy playback: no recorded exchange matches" in played[3]["exception"]
    assert "params.arguments.a: recorded 1, here 9" in played[3]["exception"]
    assert len([r for r in mcp_records(data) if r["run"] == "rec"]) == len(mcp_records(data))  # playback wrote none


def test_a_stdio_miss_goes_to_the_real_server_and_joins_the_run(tmp_path):
    data = tmp_path / "data"
    client("legacy", RECORDED, server=wrapper(data, "--run", "rec", "--name", "calc", "--", *SERVER))
    grown = client(
        "legacy",
        ASKED,
        server=wrapper(data, "--playback", "rec", "--name", "calc", "--on-miss", "record", "--", *SERVER),
    )
    assert grown[3]["text"] == "18"  # from the real server, started for the miss
    calls = [r for r in mcp_records(data) if r["mcp"].get("method") == "tools/call"]
    assert [r["run"] for r in calls] == ["rec"] * 3  # the miss was recorded into the played run
    again = client("legacy", ASKED, server=wrapper(data, "--playback", "rec", "--name", "calc"))
    assert again[1:] == grown[1:]  # and is answered from the recording from now on


def test_a_streamable_http_server_played_back_offline(tmp_path):
    data = tmp_path / "data"
    with http_server() as upstream:
        proxy = mcp_proxy(upstream, data, "--name", "web", "--run", "hrec")
        try:
            recorded = client("legacy", RECORDED, url=proxy.url + "/mcp")
        finally:
            proxy.stop()
    player = playback(data, "hrec")
    try:
        played = client("legacy", ASKED[:2], url=player.url + "/t/mcp_server=web/mcp")
        # The same request for a server the run did not record is a miss: each server answers for itself.
        init = json.loads(mcp_records(data)[0]["request_body"])
        req = urllib.request.Request(
            player.url + "/t/mcp_server=other/mcp",
            data=json.dumps(init).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
        )
        with pytest.raises(urllib.error.HTTPError) as missed:
            urllib.request.urlopen(req, timeout=30)
    finally:
        player.stop()
    assert missed.value.code == 404 and b"was never recorded" in missed.value.read()
    assert f"MCP server web (http): point its URL at {player.url}/t/mcp_server=web/mcp" in player.output()
    assert played[0] == recorded[0] and played[1] == recorded[2] and played[2] == recorded[1]


def test_what_playback_cannot_answer_is_said_never_a_traceback(tmp_path):
    """Lines that are no request, and misses whose real server cannot be started: each answered
    as an error or said on stderr and counted, and the session goes on."""
    data = tmp_path / "data"
    init = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
    )
    recorded = subprocess.run(
        wrapper(data, "--run", "rec", "--name", "calc", "--", *SERVER),
        input=init + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert recorded.returncode == 0, recorded.stderr
    call = '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2}}}'
    asked = ["garbage", '[{"jsonrpc":"2.0","id":9,"method":"ping"}]', init, call % 2, call % 3]
    played = subprocess.run(
        wrapper(data, "--playback", "rec", "--name", "calc", "--on-miss", "forward", "--", str(tmp_path / "gone")),
        input="\n".join(asked) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert played.returncode == 0 and "Traceback" not in played.stderr
    answers = [json.loads(line) for line in played.stdout.splitlines()]
    assert answers[0] == json.loads(recorded.stdout)  # the handshake, from the recording
    assert [a["id"] for a in answers[1:]] == [2, 3]
    for missed in answers[1:]:
        assert missed["error"]["code"] == -32000
        assert "the real server could not be started" in missed["error"]["message"]
    assert "(not_json) was not answered" in played.stderr and "(batch) was not answered" in played.stderr
    assert played.stderr.count("cannot start the real server") == 1  # said once, not per miss
    assert "1 answered from the recording, 2 misses, 2 lines not read" in played.stderr
