"""Every recipe in examples/recipes, run for real: the pinned harness in its own cached virtualenv,
`toolproxy run` as a subprocess, an emulated stack behind it playing a model that does the task.

Slow (the first run installs each harness; bfcl-eval alone is gigabytes), so deselected by
default; run them with `pytest -m recipes tests/recipes` (add `-k NAME` for one). Each check
asserts that the harness finished its task by its own account, that the records hold its
requests under the run's tags on the protocol it is known to speak, and what the analyzer's
report says about the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from weather_model import ANSWER, respond

from toolproxy.drive.harness import BASE_URL_VARS, PLACEHOLDER_KEYS
from toolproxy.emulators import FakeStack
from toolproxy.record.segments import read_records

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "recipes"))
from harnesses import environment  # noqa: E402

pytestmark = [pytest.mark.recipes, pytest.mark.timeout(1800)]

CHAT, RESPONSES, MESSAGES, OLLAMA = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat"
FULL_FIDELITY = {"call_fidelity": 1.0, "delivered_fidelity": 1.0}


@dataclass(frozen=True)
class Check:
    id: str
    harness: str  # key in examples/recipes/harnesses.py
    argv: tuple[str, ...]  # {python}: the harness's interpreter; {bin}: its scripts folder
    path: str  # the endpoint of the protocol it speaks
    roles: dict[str, int]  # turn roles the report must count (roles not named must be 0)
    stack: str = "llamacpp"
    output: str = ANSWER  # what the harness itself must print
    trajectory: str | None = None  # a mini-swe-agent trajectory file whose submission must be `output`
    tags: tuple[str, ...] = ()  # --tag KEY=VALUE for toolproxy run
    rates: dict[str, float | None] = field(default_factory=lambda: FULL_FIDELITY)  # pooled rates in the report
    episodes: int = 1  # episodes the report must count (one task: one episode; a probe is none)


def script(name: str, *args: str) -> tuple[str, ...]:
    return ("{python}", str(REPO / "examples" / "recipes" / name), *args)


ONE_CALL_THEN_ANSWER = {"call": 1, "answer": 1}
CHECKS = [
    Check("openai-python", "openai-python", script("openai-python.py"), CHAT, ONE_CALL_THEN_ANSWER),
    Check("openai-agents-chat", "openai-agents", script("openai-agents.py", "--chat"), CHAT, ONE_CALL_THEN_ANSWER),
    Check("openai-agents-responses", "openai-agents", script("openai-agents.py"), RESPONSES, ONE_CALL_THEN_ANSWER),
    Check("pydantic-ai", "pydantic-ai", script("pydantic-ai.py", "openai-chat:local"), CHAT, ONE_CALL_THEN_ANSWER),
    Check(
        "pydantic-ai-ollama",
        "pydantic-ai",
        script("pydantic-ai.py", "ollama:qwen2.5:7b"),
        CHAT,
        ONE_CALL_THEN_ANSWER,
        stack="ollama",
    ),
    Check("langchain-openai", "langchain-openai", script("langchain-openai.py"), CHAT, ONE_CALL_THEN_ANSWER),
    Check("langgraph", "langgraph", script("langgraph-agent.py"), CHAT, ONE_CALL_THEN_ANSWER),
    Check("smolagents", "smolagents", script("smolagents-agent.py"), CHAT, {"call": 1, "answer": 1}),
    # mini-swe-agent ends by running its submit command (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`)
    # through its bash tool: that call is its answer.
    Check(
        "mini-swe-agent",
        "mini-swe-agent",
        (
            "{bin}/mini",
            "-m",
            "openai/local",
            "-t",
            "What is the weather in Paris?",
            "--yolo",
            "--exit-immediately",
            "-o",
            "trajectory.json",
        ),
        CHAT,
        ONE_CALL_THEN_ANSWER,
        trajectory="trajectory.json",
    ),
    Check("litellm", "litellm", script("litellm-sdk.py", "openai/local"), CHAT, ONE_CALL_THEN_ANSWER),
    Check(
        "litellm-ollama",
        "litellm",
        script("litellm-sdk.py", "ollama_chat/qwen2.5:7b"),
        OLLAMA,
        ONE_CALL_THEN_ANSWER,
        stack="ollama",
    ),
    Check("ollama", "ollama", script("ollama-python.py", "qwen2.5:7b"), OLLAMA, ONE_CALL_THEN_ANSWER, stack="ollama"),
    Check("anthropic", "anthropic", script("anthropic-sdk.py"), MESSAGES, ONE_CALL_THEN_ANSWER),
    # inspect-ai's react agent ends by calling its submit tool: that call is its answer. Under
    # openai/ it first sends a probe request, recorded but not an episode.
    Check("inspect-ai", "inspect-ai", script("inspect-ai.py", "openai-api/llm/local"), CHAT, ONE_CALL_THEN_ANSWER),
    Check(
        "inspect-ai-responses", "inspect-ai", script("inspect-ai.py", "openai/local"), RESPONSES, ONE_CALL_THEN_ANSWER
    ),
    # dspy's ReAct writes its tools into the prompt and sends none; read by its prompt protocol, its
    # get_weather step is a call and its finish step the answer, and the extract step after it
    # (no tools offered) a no_tools turn, all of one episode.
    Check("dspy", "dspy", script("dspy-react.py"), CHAT, {"call": 1, "answer": 1, "no_tools": 1}),
    # BFCL scores the scripted model's placeholder arguments 0%; toolproxy must still see a valid
    # call per item. On irrelevance items (expect=none) both must agree the model did not abstain.
    Check(
        "bfcl-simple",
        "bfcl-eval",
        script("bfcl.py", "--first", "3", "simple_python"),
        CHAT,
        {"call": 3},
        output="Test completed: simple_python. 🎯 Accuracy: 0.00%",
        tags=("category=simple_python",),
        episodes=3,
    ),
    Check(
        "bfcl-irrelevance",
        "bfcl-eval",
        script("bfcl.py", "--first", "3", "irrelevance"),
        CHAT,
        {"abstain": 3},
        output="Test completed: irrelevance. 🎯 Accuracy: 0.00%",
        tags=("category=irrelevance", "expect=none"),
        rates={"call_fidelity": None, "restraint": 0.0},
        episodes=3,
    ),
]


def _served(stack: str, path: str) -> bool:
    return any(p == path for _, p, _ in FakeStack(stack).stack.routes())


def _clean_env(python_bin: Path) -> dict[str, str]:
    """Our environment without any base URL or key, so the harness sees only what toolproxy run sets."""
    drop = {name for name, _, _ in BASE_URL_VARS} | set(PLACEHOLDER_KEYS) | {"VIRTUAL_ENV", "BFCL_PROJECT_ROOT"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = f"{python_bin}{os.pathsep}{env.get('PATH', '')}"
    return env


def _toolproxy(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", *args], text=True, capture_output=True, stdin=subprocess.DEVNULL, **kw
    )


@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
def test_recipe(check: Check, tmp_path: Path):
    if not _served(check.stack, check.path):
        pytest.skip(
            f"the emulated {check.stack} does not serve {check.path} yet "
            "(waiting for the wire branch's Responses/Messages emulation on main)"
        )
    bindir = environment(check.harness) / "bin"
    argv = [a.format(python=bindir / "python", bin=bindir) for a in check.argv]
    tags = [arg for t in check.tags for arg in ("--tag", t)]
    data = tmp_path / "data"
    with FakeStack(check.stack, responder=respond).in_thread() as url:
        done = _toolproxy(
            "run",
            "--upstream",
            url,
            "--run",
            check.id,
            "--data",
            str(data),
            "--no-fingerprint",
            *tags,
            "--",
            *argv,
            env=_clean_env(bindir),
            cwd=tmp_path,
            timeout=900,
        )
    print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert check.output in done.stdout + done.stderr
    if check.trajectory:
        info = json.loads((tmp_path / check.trajectory).read_text())["info"]
        assert (info["exit_status"], info["submission"].strip()) == ("Submitted", check.output)

    exchanges = [r for r in read_records(data) if r.get("kind", "exchange") == "exchange"]
    model_calls = [r for r in exchanges if r["path"] in (CHAT, RESPONSES, MESSAGES, OLLAMA)]
    assert model_calls, "the harness reached the proxy with no model request"
    assert {r["path"] for r in model_calls} == {check.path}
    assert {r["run"] for r in exchanges} == {check.id}
    assert all(r["status"] == 200 for r in model_calls)
    expected_tags = dict(t.split("=", 1) for t in check.tags)
    assert all({k: r["tags"].get(k) for k in expected_tags} == expected_tags for r in model_calls)

    report = _toolproxy("report", "--data", str(data), "--run", check.id, "--format", "json", timeout=300)
    assert report.returncode == 0, report.stderr
    (run,) = json.loads(report.stdout)["runs"]
    assert {k: v for k, v in run["roles"].items() if v} == check.roles
    assert run["episodes"] == check.episodes
    assert {name: run[name]["pooled"] for name in check.rates} == check.rates
    assert run["outcomes"]["non_response"] == 0
