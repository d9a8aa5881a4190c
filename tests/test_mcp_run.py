"""`toolproxy run --mcp-config`: an openai-agents agent whose MCP server is wrapped for the run,
its tools' traffic recorded beside the model's and held to the agent's own record of what it
executed; then the same agent test run offline from the recording, model and tools."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcpprocs import SERVER, http_server, mcp_records

from toolproxy.emulators.model import call, text

pytest.importorskip("agents")

AGENT = [sys.executable, str(Path(__file__).resolve().parent / "mcpagent.py")]


def toolproxy(*args: str, model: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MODEL": model},
    )


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_an_agents_mcp_server_recorded_in_its_run_and_played_back(fake_stack, tmp_path, transport):
    fake = fake_stack("vllm", tool_parser="hermes")
    fake.enqueue(call("add", {"a": 2, "b": 3}), call("fail", {"reason": "disk full"}), text("The sum is 5."))
    config = tmp_path / "mcp.json"
    data = tmp_path / "data"
    with contextlib.ExitStack() as stack:
        if transport == "stdio":
            entry = {"command": SERVER[0], "args": SERVER[1:]}
        else:
            entry = {"type": "http", "url": stack.enter_context(http_server()) + "/mcp"}
        config.write_text(json.dumps({"mcpServers": {"calc": entry}}))
        done = _agent(config, data, fake.model, "--upstream", fake.url, "--run", "agent", "--no-fingerprint")
    assert done.returncode == 0, done.stderr
    own = json.loads(done.stdout.strip().splitlines()[-1])
    assert own["called"] == ["add", "fail"] and own["final"] == "The sum is 5."
    assert "MCP servers of" in done.stderr and f"calc ({transport})" in done.stderr
    assert json.loads(config.read_text())["mcpServers"]["calc"] == entry  # the user's file untouched
    assert not list((data / "mcp-config").iterdir())  # its copy, with whatever secrets it held, gone with the run
    recs = mcp_records(data)
    assert {r["mcp"]["transport"] for r in recs} == {transport}
    executed = [_call(r) for r in recs if _call(r) is not None]
    # What the agent says it executed is what the tool side recorded, in the run and episode of its model traffic.
    assert [request["params"]["name"] for request, _ in executed] == own["called"]
    assert {(r["run"], r["episode"], r["mcp"]["server"]) for r in recs} == {("agent", "1", "calc")}
    outputs = [response["result"] for _, response in executed]
    assert [o["isError"] for o in outputs] == [False, True]
    assert outputs[0]["content"][0]["text"] in json.dumps(own["outputs"][0])
    # The analyzer says the same of the tool side: each call the agent made, its server and its outcome.
    assert toolproxy("analyze", "--data", str(data), model=fake.model).returncode == 0
    rows = toolproxy(
        "sql",
        "--data",
        str(data),
        "--format",
        "json",
        "SELECT episode, server, transport, tool, result FROM mcp_exchanges "
        "WHERE run = 'agent' AND method = 'tools/call' ORDER BY started_at",
        model=fake.model,
    )
    assert rows.returncode == 0, rows.stderr
    assert json.loads(rows.stdout) == [
        {"episode": "1", "server": "calc", "transport": transport, "tool": tool, "result": result}
        for tool, result in zip(own["called"], ["ok", "tool_error"], strict=True)
    ]
    # Offline: no model server, no MCP server; the agent gets what it got, its new run recorded.
    played = _agent(config, data, fake.model, "--playback", "agent", "--run", "again")
    assert played.returncode == 0, played.stderr
    assert json.loads(played.stdout.strip().splitlines()[-1]) == own
    again = [_call(r) for r in mcp_records(data) if r["run"] == "again" and _call(r) is not None]
    assert [response for _, response in again] == [response for _, response in executed]


def _call(rec: dict) -> tuple[dict, dict] | None:
    """(the tools/call request, its response) an MCP record holds, over either transport; or None."""
    try:
        request = json.loads(rec.get("request_body") or "null")
    except ValueError:
        return None
    if not isinstance(request, dict) or request.get("method") != "tools/call":
        return None
    body = rec.get("response_body") or ""
    data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
    return request, json.loads(data[-1] if data else body)


def _agent(config: Path, data: Path, model: str, *how: str) -> subprocess.CompletedProcess:
    """tests/mcpagent.py under `toolproxy run --mcp-config`, in episode 1, `how` saying where its
    model and run are."""
    return toolproxy(
        "run",
        *how,
        "--data",
        str(data),
        "--mcp-config",
        str(config),
        "--tag",
        "episode=1",
        "--",
        *AGENT,
        str(config),
        "Add 2 and 3.",
        model=model,
    )
