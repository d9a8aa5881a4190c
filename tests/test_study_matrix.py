"""`toolproxy study` as a matrix: upstreams x models x conditions, each cell a run, one proxy per
upstream, the model rewritten on the way up and both names kept."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from test_study import HARNESS, _responder

from toolproxy.drive.study import Planned, cell_line, parse_upstreams, run_name
from toolproxy.record.segments import read_records

MODELS = ("m-1", "org/m:2")  # the second as vLLM and Ollama spell theirs


@pytest.fixture
def matrix(fake_stack, tmp_path):
    lc = fake_stack("llamacpp", responder=_responder)
    sg = fake_stack("sglang", responder=_responder)
    harness = tmp_path / "agent.py"
    harness.write_text(HARNESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(MODEL="harness-model", HOLD=str(tmp_path / "hold"))
    return lc, sg, harness, env, tmp_path / "data"


def _study(lc, sg, harness, data, *models):
    argv = [
        sys.executable,
        "-m",
        "toolproxy.cli",
        "study",
        "--upstream",
        f"lc={lc.url}",
        "--upstream",
        f"sg={sg.url}",
        "--data",
        str(data),
        "--name",
        "s",
        "--conditions",
        "native",
    ]
    for m in models:
        argv += ["--model", m]
    return argv + ["--", sys.executable, str(harness)]


def _chat(fake):
    return [s for s in fake.seen if s.path.endswith("/chat/completions")]


def test_every_cell_is_a_run_whose_requests_carry_its_model_upstream(matrix):
    lc, sg, harness, env, data = matrix
    done = subprocess.run(_study(lc, sg, harness, data, *MODELS), env=env, text=True, capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr
    state = json.loads((data / "studies" / "s.json").read_text())
    assert [(r["run"], r["stack"], r["model"], r["status"]) for r in state["runs"]] == [
        ("s-lc-m-1-native", "lc", "m-1", "done"),
        ("s-lc-org_m_2-native", "lc", "org/m:2", "done"),
        ("s-sg-m-1-native", "sg", "m-1", "done"),
        ("s-sg-org_m_2-native", "sg", "org/m:2", "done"),
    ]

    # Upstream, each stack saw only its own cells' requests, each with the cell's model, never the harness's.
    for fake in (lc, sg):
        models = [s.json()["model"] for s in _chat(fake)]
        assert sorted(set(models)) == sorted(MODELS) and "harness-model" not in models
    # The records keep both names: the harness's body as it came, the model sent beside it.
    exchanges = [r for r in read_records(data) if r.get("kind", "exchange") == "exchange"]
    assert {r["run"] for r in exchanges} == {r["run"] for r in state["runs"]}
    for r in exchanges:
        planned = next(p for p in state["runs"] if p["run"] == r["run"])
        assert json.loads(r["request_body"])["model"] == "harness-model"
        assert r["extra"]["model_sent"] == planned["model"]
        assert json.loads(r["upstream_request"]["body"])["model"] == planned["model"]
        assert r["upstream"] == (lc.url if planned["stack"] == "lc" else sg.url)

    # The analyzer counts a run under the model the stack was asked for, with its stack's fingerprint.
    report = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "report", "--data", str(data), "--format", "json"],
        text=True,
        capture_output=True,
        timeout=120,
    )
    runs = {r["run"]: r for r in json.loads(report.stdout)["runs"]}
    assert {(name, r["model"], r["stack"]) for name, r in runs.items()} == {
        ("s-lc-m-1-native", "m-1", "llamacpp"),
        ("s-lc-org_m_2-native", "org/m:2", "llamacpp"),
        ("s-sg-m-1-native", "m-1", "sglang"),
        ("s-sg-org_m_2-native", "org/m:2", "sglang"),
    }
    assert "| run | condition | stack | model | status |" in done.stdout
    assert "| s-sg-org_m_2-native | native | sg | org/m:2 | done | 3 |" in done.stdout
    # Progress across the whole matrix, a line of its own per cell.
    cells = [line for line in done.stderr.splitlines() if line.startswith("study s: s-")]
    assert cells[0] == "study s: s-lc-m-1-native (stack lc, model m-1, condition native); 0/4 cells done"
    assert cells[3].startswith(
        "study s: s-sg-org_m_2-native (stack sg, model org/m:2, condition native); 3/4 cells done, about "
    )


def test_ctrl_c_in_a_cell_and_the_rerun_resumes_the_matrix(matrix):
    lc, sg, harness, env, data = matrix
    open(env["HOLD"], "w").close()
    proc = subprocess.Popen(
        _study(lc, sg, harness, data, "m-1"), env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.readline().strip() == "holding"  # the first cell's harness did its tasks
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    state = json.loads((data / "studies" / "s.json").read_text())
    assert [(r["run"], r["status"]) for r in state["runs"]] == [
        ("s-lc-m-1-native", "interrupted"),
        ("s-sg-m-1-native", "pending"),
    ]

    other = subprocess.run(_study(lc, sg, harness, data, "m-2"), env=env, text=True, capture_output=True, timeout=60)
    assert other.returncode == 2 and "was planned with other models (its models: m-1; given: m-2)" in other.stderr
    assert "Traceback" not in other.stderr

    os.unlink(env["HOLD"])
    done = subprocess.run(_study(lc, sg, harness, data, "m-1"), env=env, text=True, capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr
    state = json.loads((data / "studies" / "s.json").read_text())
    assert [(r["run"], r["status"], r["attempts"]) for r in state["runs"]] == [
        ("s-lc-m-1-native~2", "done", ["s-lc-m-1-native"]),
        ("s-sg-m-1-native", "done", []),
    ]
    cells = [line for line in done.stderr.splitlines() if line.startswith("study s: s-")]
    assert cells[0].startswith("study s: s-lc-m-1-native~2 ") and "1/2 cells done" in cells[1]
    assert {s.json()["model"] for s in _chat(lc) + _chat(sg)} == {"m-1"}


@pytest.mark.parametrize(
    "args, words",
    [
        (["--upstream", "http://127.0.0.1:9", "--upstream", "http://127.0.0.1:8"], "name every upstream"),
        (["--upstream", "a=http://127.0.0.1:9", "--upstream", "a=http://127.0.0.1:8"], "its own name"),
        (["--upstream", "a-b=http://127.0.0.1:9"], "an upstream name is"),
        (["--upstream", "a=http://127.0.0.1:9", "--upstream", "b=http://127.0.0.1:8", "--port", "8787"], "--port"),
        (["--upstream", "http://127.0.0.1:9", "--model", "a/b", "--model", "a:b"], "distinct model names"),
        (["--upstream", "a=ftp://127.0.0.1:9"], "upstream"),
    ],
)
def test_a_matrix_that_cannot_run_is_a_usage_error(tmp_path, args, words):
    done = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "study", *args, "--data", str(tmp_path), "--", "true"],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_run_names_address_every_cell():
    assert run_name("s", "text", 1, 1) == "s-text"  # one unnamed upstream, the harness's model: as before
    assert run_name("s", "text", 2, 3, "jinja") == "s-jinja-text-2"
    assert run_name("s", "hint", 1, 1, None, "qwen2.5:7b") == "s-qwen2.5_7b-hint"
    assert (
        run_name("s", "native", 1, 2, "vllm", "Qwen/Qwen2.5-7B-Instruct") == "s-vllm-Qwen_Qwen2.5-7B-Instruct-native-1"
    )
    assert parse_upstreams(("http://a:1/v1?x=1",)) == [(None, "http://a:1/v1?x=1")]
    assert parse_upstreams(("j=http://a:1", "p=http://a:2")) == [("j", "http://a:1"), ("p", "http://a:2")]
    planned = Planned("text", 1, "s-j-text", stack="j")
    assert (
        cell_line("s", planned, 6, 2, [60.0, 120.0], 4)
        == "study s: s-j-text (stack j, condition text); 2/6 cells done, about 8m00s left"
    )


def test_on_a_terminal_the_harness_output_never_shares_the_progress_line(matrix):
    """The progress line is erased before the harness's output and redrawn only at the start of a
    line: a half-written line of the harness stays whole through the redraws."""
    from ptyrun import REDRAW, on_a_terminal

    lc, _, harness, env, data = matrix
    noisy = harness.with_name("noisy.py")
    noisy.write_text(
        f"import runpy, sys, time\nrunpy.run_path({str(harness)!r})\ntime.sleep(1.5)\n"
        "print('step 1', file=sys.stderr, flush=True)\ntime.sleep(1.5)\n"
        "print('half', end='', file=sys.stderr, flush=True)\ntime.sleep(2.5)\n"
        "print(' done', file=sys.stderr, flush=True)\nprint('to stdout')\n"
    )
    argv = [
        sys.executable,
        "-m",
        "toolproxy.cli",
        "study",
        "--upstream",
        f"lc={lc.url}",
        "--data",
        str(data),
        "--name",
        "s",
        "--conditions",
        "native",
        "--no-fingerprint",
        "--",
        sys.executable,
        str(noisy),
    ]
    rc, stdout, tty = on_a_terminal(argv, env=env)
    assert rc == 0, tty
    assert REDRAW + b"step 1\r\n" in tty  # the progress line erased, then the harness's line
    assert re.search(rb"\r\x1b\[2K  s-lc-native: \d+ exchanges", tty), tty  # redrawn while it slept
    assert b"half done\r\n" in tty  # no redraw in the middle of its line
    assert stdout.startswith(b"to stdout\n")  # its stdout stays the study's stdout, before the results
