"""`toolproxy run` with each coding agent (toolproxy.drive.agents): the environment run builds is
what the agent reads its endpoint from (a stand-in reads it exactly as the agent does and sends
the agent's request; tests/agentstandin.py), the user's own config is left alone, a harness that
sends nothing is said to, and Gemini CLI's captured traffic reads back and replays through the
bridge. Where the npm agents are installed, the agents themselves do their task through run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ptyrun import on_a_terminal
from test_protocols import sql, tp

from toolproxy.drive.agents import AGENTS, agent_of
from toolproxy.emulators import FakeStack, ModelRequest, call, text
from toolproxy.record.segments import read_records

HERE = Path(__file__).parent
STANDIN = HERE / "agentstandin.py"
GEMINI_CAPTURE = HERE / "data" / "agents" / "emulated" / "gemini-cli"
AGENT_BIN = Path(os.environ.get("TOOLPROXY_AGENT_BIN", "/work/scratch/agents/npm/bin"))


def agent_model(req: ModelRequest):
    """The scripted model of the Gemini CLI capture: the routing request answered as its schema
    asks, write_file, then the answer."""
    fmt = req.body.get("response_format") or {}
    props = ((fmt.get("json_schema") or {}).get("schema") or {}).get("properties") or {}
    if props:
        return text(json.dumps({k: "simple task" if v.get("type") == "string" else 10 for k, v in props.items()}))
    if any(m.get("role") == "tool" for m in req.messages):
        return text("Done: hello.txt contains hi.")
    if "write_file" in req.tools:
        return call("write_file", {"file_path": "hello.txt", "content": "hi"})
    if "exec_command" in req.tools:
        return call("exec_command", {"cmd": "printf 'hi\\n' > hello.txt"})
    return text("ok")


@pytest.fixture(scope="module")
def fake():
    stack = FakeStack("llamacpp", responder=agent_model)
    with stack.in_thread():
        yield stack


def run(fake, tmp_path, *argv, env=None, args=(), analyze=False, cwd=None, timeout=300):
    """`toolproxy run` (run name `agents`) in a home of its own, with no endpoint variable of the
    user's."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_"))}
    environ.update(HOME=str(home), **(env or {}))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "run",
            "--upstream",
            fake.url,
            "--data",
            str(tmp_path / "data"),
            "--run",
            "agents",
            *(() if analyze else ("--no-analyze",)),
            *args,
            "--",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
        cwd=cwd or tmp_path,
    )


def test_the_upstreams_model_name_reaches_the_terminal_printable(tmp_path):
    """Without --agent-model the name is the first /v1/models lists: the upstream's bytes. click
    strips escape sequences only when stderr is no terminal, so this is seen on one."""
    stack = FakeStack("llamacpp", models={"m\x1b[2Jx": ("tools",)}, responder=agent_model)
    with stack.in_thread():
        cmd = [sys.executable, "-m", "toolproxy.cli", "run", "--upstream", stack.url, "--data", str(tmp_path / "data")]
        cmd += ["--no-analyze", "--agent", "qwen-code", "--", sys.executable, "-c", "pass"]
        _, _, seen = on_a_terminal(cmd, env={**os.environ, "HOME": str(tmp_path)})
    assert b"Qwen Code pointed at the proxy" in seen and b"(model m" in seen, seen
    assert b"\x1b[2J" not in seen, seen


PATHS = {
    "claude-code": "/v1/messages",
    "codex": "/v1/responses",
    "gemini-cli": "/v1beta/models/gemini-3.8-flash:streamGenerateContent",
    "qwen-code": "/v1/chat/completions",
    "opencode": "/v1/chat/completions",
    "aider": "/v1/chat/completions",
    "mini-swe-agent": "/v1/chat/completions",
}


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_each_agent_finds_the_proxy_where_it_reads_its_endpoint(fake, tmp_path, name):
    r = run(fake, tmp_path, sys.executable, str(STANDIN), name, args=("--agent", name))
    assert r.returncode == 0, r.stderr
    assert f"{AGENTS[name].title} pointed at the proxy" in r.stderr
    recs = [x for x in read_records(tmp_path / "data") if x.get("kind") == "exchange"]
    assert [(x["path"], x["run"], x["status"]) for x in recs] == [(PATHS[name], "agents", 200)]
    assert recs[0]["extra"].get("model_sent") is None
    sent = fake.seen[-1].json()
    # the model the upstream lists, as run asked it (Gemini CLI picks its own, named in the path)
    assert sent.get("model") == ("gemini-3.8-flash" if name == "gemini-cli" else fake.model)
    assert not (tmp_path / "home" / ".gemini").exists() and not (tmp_path / "home" / ".codex").exists()


def test_the_users_own_settings_are_copied_never_edited(fake, tmp_path):
    user = tmp_path / "home" / ".gemini"
    user.mkdir(parents=True)
    mine = {"ui": {"theme": "Dracula"}, "security": {"auth": {"selectedType": "oauth-personal"}}}
    (user / "settings.json").write_text(json.dumps(mine))
    (user / "trustedFolders.json").write_text('{"/x": "TRUST_FOLDER"}')
    r = run(fake, tmp_path, sys.executable, str(STANDIN), "gemini-cli", args=("--agent", "gemini-cli"))
    assert r.returncode == 0, r.stderr
    assert json.loads((user / "settings.json").read_text()) == mine
    given = tmp_path / "data" / "agents" / "gemini-cli" / "home" / ".gemini"
    settings = json.loads((given / "settings.json").read_text())
    assert settings["ui"] == {"theme": "Dracula"} and settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert json.loads((given / "trustedFolders.json").read_text()) == {"/x": "TRUST_FOLDER"}


def test_without_what_run_sets_gemini_cli_exits_and_run_says_nothing_reached_the_proxy(fake, tmp_path):
    r = run(
        fake,
        tmp_path,
        sys.executable,
        str(STANDIN),
        "gemini-cli",
        args=("--agent", "none"),
        env={"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9", "GEMINI_CLI_HOME": str(tmp_path)},
    )
    assert r.returncode == 41 if (tmp_path / ".gemini" / "settings.json").exists() else r.returncode != 0
    assert "no request reached the proxy" in r.stderr


def test_agents_are_known_by_their_command():
    cases = {
        ("claude", "-p", "x"): "claude-code",
        ("/usr/local/bin/codex", "exec"): "codex",
        ("npx", "-y", "@google/gemini-cli", "-p", "x"): "gemini-cli",
        ("env", "A=1", "qwen"): "qwen-code",
        ("opencode", "run"): "opencode",
        ("aider",): "aider",
        ("mini", "-t", "x"): "mini-swe-agent",
        ("python", "agent.py"): None,
    }
    for argv, name in cases.items():
        found = agent_of(list(argv))
        assert (found.name if found else None) == name, argv


def test_gemini_clis_captured_traffic_reads_as_its_turns(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(GEMINI_CAPTURE / "segments", data / "segments")
    r = tp("analyze", "--data", str(data))
    assert r.returncode == 0, r.stderr
    rows = sql(
        data,
        "SELECT path, model, is_attempt, side_request, outcome, surface, n_calls FROM exchanges ORDER BY started_at",
    )
    assert [(x["path"].rsplit(":", 1)[1], x["model"], x["side_request"], x["outcome"]) for x in rows] == [
        ("generateContent", None, "routing", None),  # a side request: no turn, no model row
        ("streamGenerateContent", "gemini-3.8-flash", None, "valid_call"),
        ("streamGenerateContent", "gemini-3.8-flash", None, "prose"),
    ]
    assert [x["is_attempt"] for x in rows] == [False, True, True]
    assert rows[1]["surface"] == "native" and rows[1]["n_calls"] == 1
    calls = sql(data, "SELECT name, valid FROM calls")
    assert calls == [{"name": "write_file", "valid": True}]
    said = json.loads((GEMINI_CAPTURE / "agent" / "stdout-0.json").read_text())
    assert said["stats"]["tools"]["byName"]["write_file"]["success"] == 1  # Gemini CLI's own record agrees


@pytest.mark.skipif(not (AGENT_BIN / "gemini").exists(), reason="Gemini CLI is not installed")
@pytest.mark.timeout(600)
def test_gemini_cli_itself_does_its_task_through_run(fake, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    r = run(
        fake,
        tmp_path,
        str(AGENT_BIN / "gemini"),
        "-p",
        "create hello.txt containing hi",
        "--yolo",
        analyze=True,
        cwd=repo,
        timeout=500,
        env={"GEMINI_CLI_TRUST_WORKSPACE": "true", "PATH": f"{AGENT_BIN}:{os.environ['PATH']}"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (repo / "hello.txt").read_text() == "hi"
    assert "call fidelity 100%" in r.stderr
