"""examples/react_agent.py end to end through `toolproxy serve`, with the standard library only.

The agent runs as `python -I -S` (no site-packages: nothing but the standard library can be
imported), so it works on the base install. A llama.cpp that calls the calculator and then
answers gives finished, tagged episodes; one launched without --jinja refuses every request with
tools, and the agent says so in one line and exits 1; a proxy that is not there is exit 2.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from toolproxy import emulators as fakes
from toolproxy.record.segments import read_records

AGENT = Path(__file__).resolve().parent.parent / "examples" / "react_agent.py"


def calculator_then_answer(req: fakes.ModelRequest) -> fakes.ScriptedReply:
    if any(m.get("role") == "tool" for m in req.messages):
        return fakes.text(f"The answer is {req.messages[-1]['content']}.")
    return fakes.call("calculator", {"expression": "(17 * 23) + 11"})


def agent(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(AGENT), "--model", "qwen", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or {},
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_episodes_finish_and_are_recorded_under_their_tags(fake_stack, proxy, stream):
    fake = fake_stack("llamacpp", responder=calculator_then_answer)
    p = proxy(fake.url, "--quiet", "--no-fingerprint")
    done = agent("--proxy", p.url, "--run", "react-test", "--episodes", "2", *(["--stream"] if stream else []))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("'calculator'({'expression': '(17 * 23) + 11'}) -> 402") == 2
    assert done.stdout.count("answer: 'The answer is 402.'") == 2 and done.stderr == ""
    recs = p.wait_records(4)
    assert [(r["run"], r["episode"], r["item"], r["status"]) for r in recs] == [
        ("react-test", "0", "task_0", 200),
        ("react-test", "0", "task_0", 200),
        ("react-test", "1", "task_1", 200),
        ("react-test", "1", "task_1", 200),
    ]
    second = json.loads(recs[1]["request_body"])
    assert second["tools"][0]["function"]["name"] == "calculator" and bool(second.get("stream")) == stream
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": second["messages"][-2]["tool_calls"][0]["id"],
        "content": "402",
    }


def test_a_stack_that_refuses_tools_is_one_line_and_exit_1(fake_stack, proxy):
    fake = fake_stack("no_jinja")
    p = proxy(fake.url, "--quiet", "--no-fingerprint")
    done = agent("--proxy", p.url, "--episodes", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == (
        "react_agent: 2 of 2 episodes ended on a server error; the first: "
        "HTTP 500: 'tools param requires --jinja flag'\n"
    )
    assert done.stdout.count("the server answered an error: HTTP 500: 'tools param requires --jinja flag'") == 2
    recs = p.wait_records(4)
    # every episode's request and its one retry (as the openai SDK with max_retries=1), recorded
    assert [(r["episode"], r["status"]) for r in recs] == [("0", 500), ("0", 500), ("1", 500), ("1", 500)]


@pytest.mark.parametrize(
    "kind, reply",
    [
        ("sglang", fakes.call("calculator", {"expression": "(17 * 23) + 11"})),  # no parser: left in <tool_call> tags
        ("llamacpp", fakes.text('{"name": "calculator", "arguments": {"expression": "(17 * 23) + 11"}}')),
    ],
    ids=["hermes-tags", "bare-json"],
)
def test_an_answer_that_is_a_tool_call_in_text_is_exit_1(fake_stack, proxy, kind, reply):
    fake = fake_stack(kind, responder=lambda req: reply)
    p = proxy(fake.url, "--quiet", "--no-fingerprint")
    done = agent("--proxy", p.url, "--episodes", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("that is a tool call written as text, not an answer: the server did not extract it") == 2
    assert done.stderr == (
        "react_agent: 2 of 2 episodes ended on a tool call left in text (the server returned it as "
        "content, not tool_calls: a missing or mismatched tool-call parser; `toolproxy doctor` "
        "names the fix)\n"
    )


def test_a_prose_answer_that_mentions_json_is_an_answer(fake_stack, proxy):
    fake = fake_stack(
        "llamacpp", responder=lambda req: fakes.text('The result is {"value": 402}; the tool "calculator" agrees.')
    )
    p = proxy(fake.url, "--quiet", "--no-fingerprint")
    done = agent("--proxy", p.url, "--episodes", "1")
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr


def test_under_toolproxy_run_it_appends_its_tags_to_the_run_s_tagged_root(fake_stack, tmp_path):
    fake = fake_stack("llamacpp", responder=calculator_then_answer)
    data = tmp_path / "data"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "run",
            "--upstream",
            fake.url,
            "--run",
            "study-hint",
            "--condition",
            "hint",
            "--data",
            str(data),
            "--no-fingerprint",
            "--",
            sys.executable,
            "-I",
            "-S",
            str(AGENT),
            "--model",
            "qwen",
            "--episodes",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    recs = [r for r in read_records(data) if r.get("kind", "exchange") == "exchange"]
    assert sorted((r["run"], r["condition"], r["episode"], r["item"]) for r in recs) == [
        ("study-hint", "hint", "0", "task_0"),
        ("study-hint", "hint", "0", "task_0"),
        ("study-hint", "hint", "1", "task_1"),
        ("study-hint", "hint", "1", "task_1"),
    ]
    assert "run study-hint: 2 episodes" in done.stderr


def test_no_proxy_there_is_exit_2_in_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = agent("--proxy", f"http://127.0.0.1:{port}")
    assert done.returncode == 2
    assert (
        done.stderr
        == f"react_agent: cannot reach http://127.0.0.1:{port}: Connection refused. Is toolproxy running there?\n"
    )


@pytest.mark.parametrize(
    "expression, result",
    [
        ("(17 * 23) + 11", "402"),
        ("2 ** 20 / 1024", "1024.0"),
        ("-3 + +4", "1"),
        ("9 ** 9 ** 9", "error: exponent or base too large"),
        ("__import__('os')", "error: only numbers, + - * / ** and parentheses are allowed"),
        ("1 / 0", "error: division by zero"),
        ("1 +", "error: invalid syntax (<unknown>, line 1)"),
        ("1" * 201, "error: expression too long"),
    ],
)
def test_the_calculator_only_does_bounded_arithmetic(expression, result):
    spec = importlib.util.spec_from_file_location("react_agent", AGENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.run_tool("calculator", {"expression": expression}) == result
