"""Every recipe in examples/recipes, run for real: the pinned harness in its own cached virtualenv,
`toolproxy run` as a subprocess, an emulated stack behind it playing a model that does the task.

Slow (the first run installs each harness), so deselected by default; run them with
`pytest -m recipes tests/recipes` (add `-k NAME` for one). Each check asserts that the harness
finished its one-tool task by its own account, that the records hold its requests under the run's
tag on the protocol it is known to speak, and what the analyzer makes of the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from toolproxy.harness import BASE_URL_VARS, PLACEHOLDER_KEYS
from toolproxy.record.segments import read_records
from toolproxy.stacks.fakes import FakeStack

from weather_model import ANSWER, respond

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "recipes"))
from harnesses import environment  # noqa: E402

pytestmark = [pytest.mark.recipes, pytest.mark.timeout(1800)]

CHAT, RESPONSES, MESSAGES, OLLAMA = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat"


@dataclass(frozen=True)
class Check:
    id: str
    harness: str  # key in examples/recipes/harnesses.py
    argv: tuple[str, ...]  # {python}: the harness's interpreter; {bin}: its scripts folder
    paths: frozenset[str]  # the protocol it speaks, by endpoint
    roles: dict[str, int]  # what the analyzer must find (roles not named must be 0)
    stack: str = "llamacpp"
    output: str = ANSWER  # what the harness itself must print
    trajectory: str | None = None  # a mini-swe-agent trajectory file whose submission must be `output`
    model: str = "qwen2.5-coder"


def script(name: str, *args: str) -> tuple[str, ...]:
    return ("{python}", str(REPO / "examples" / "recipes" / name), *args)


ONE_CALL_THEN_ANSWER = {"call": 1, "answer": 1}
CHECKS = [
    Check("openai-python", "openai-python", script("openai-python.py"), frozenset({CHAT}), ONE_CALL_THEN_ANSWER),
    Check("openai-agents-chat", "openai-agents", script("openai-agents.py", "--chat"), frozenset({CHAT}),
          ONE_CALL_THEN_ANSWER),
    Check("openai-agents-responses", "openai-agents", script("openai-agents.py"), frozenset({RESPONSES}),
          ONE_CALL_THEN_ANSWER),
    Check("anthropic", "anthropic", script("anthropic-sdk.py"), frozenset({MESSAGES}), ONE_CALL_THEN_ANSWER),
    Check("pydantic-ai", "pydantic-ai", script("pydantic-ai.py", "openai-chat:local"), frozenset({CHAT}),
          ONE_CALL_THEN_ANSWER),
    Check("pydantic-ai-ollama", "pydantic-ai", script("pydantic-ai.py", "ollama:qwen2.5:7b"), frozenset({CHAT}),
          ONE_CALL_THEN_ANSWER, stack="ollama"),
    Check("langchain-openai", "langchain-openai", script("langchain-openai.py"), frozenset({CHAT}),
          ONE_CALL_THEN_ANSWER),
    Check("litellm", "litellm", script("litellm-sdk.py", "openai/local"), frozenset({CHAT}), ONE_CALL_THEN_ANSWER),
    Check("litellm-ollama", "litellm", script("litellm-sdk.py", "ollama_chat/qwen2.5:7b"), frozenset({OLLAMA}),
          ONE_CALL_THEN_ANSWER, stack="ollama"),
    Check("smolagents", "smolagents", script("smolagents-agent.py"), frozenset({CHAT}), {"call": 2}),
    Check("mini-swe-agent", "mini-swe-agent",
          ("{bin}/mini", "-m", "openai/local", "-t", "What is the weather in Paris?", "--yolo", "--exit-immediately",
           "-o", "trajectory.json"), frozenset({CHAT}), {"call": 2}, trajectory="trajectory.json"),
    Check("ollama", "ollama", script("ollama-python.py", "qwen2.5:7b"), frozenset({OLLAMA}), ONE_CALL_THEN_ANSWER,
          stack="ollama"),
]


def _served(stack: str, path: str) -> bool:
    return any(p == path for _, p, _ in FakeStack(stack).stack.routes())


def _clean_env(python_bin: Path) -> dict[str, str]:
    """Our environment without any base URL or key, so the harness sees only what toolproxy run sets."""
    drop = {name for name, _, _ in BASE_URL_VARS} | set(PLACEHOLDER_KEYS)
    env = {k: v for k, v in os.environ.items() if k not in drop and k != "VIRTUAL_ENV"}
    env["PATH"] = f"{python_bin}{os.pathsep}{env.get('PATH', '')}"
    return env


def _toolproxy(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolproxy.cli", *args], text=True, capture_output=True,
                          stdin=subprocess.DEVNULL, **kw)


@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
def test_recipe(check: Check, tmp_path: Path):
    missing = [p for p in check.paths if not _served(check.stack, p)]
    if missing:
        pytest.skip(f"the emulated {check.stack} does not serve {', '.join(missing)} yet "
                    "(waiting for the wire branch's Responses/Messages emulation on main)")
    bindir = environment(check.harness) / "bin"
    argv = [a.format(python=bindir / "python", bin=bindir, model=check.model) for a in check.argv]
    data = tmp_path / "data"
    fake = FakeStack(check.stack, responder=respond)
    with fake.in_thread() as url:
        done = _toolproxy("run", "--upstream", url, "--run", check.id, "--data", str(data), "--no-fingerprint",
                          "--", *argv, env=_clean_env(bindir), cwd=tmp_path, timeout=900)
    print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert check.output in done.stdout + done.stderr
    if check.trajectory:
        info = json.loads((tmp_path / check.trajectory).read_text())["info"]
        assert (info["exit_status"], info["submission"].strip()) == ("Submitted", check.output)

    exchanges = [r for r in read_records(data) if r.get("kind", "exchange") == "exchange"]
    assert exchanges, "the harness reached the proxy with no request"
    assert {r["run"] for r in exchanges} == {check.id}
    model_paths = {r["path"] for r in exchanges if r["path"] in (CHAT, RESPONSES, MESSAGES, OLLAMA)}
    assert model_paths == check.paths
    assert all(r["status"] == 200 for r in exchanges if r["path"] in check.paths)

    report = _toolproxy("report", "--data", str(data), "--run", check.id, "--format", "json", timeout=300)
    assert report.returncode == 0, report.stderr
    (run,) = json.loads(report.stdout)["runs"]
    assert {k: v for k, v in run["roles"].items() if v} == check.roles
    assert run["call_fidelity"]["pooled"] == 1.0
    assert run["delivered_fidelity"]["pooled"] == 1.0
    assert run["outcomes"]["non_response"] == 0
