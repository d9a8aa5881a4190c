"""`toolproxy study` as a newcomer meets it, run to the end: the example agent exiting 1 on every
call left in text, a dead upstream, one that dies mid-study and a corrected one, a harness that
sends nothing, a stack that refuses everything, and one headline number per cell in every output.

The scripted model answers the example agent's five tasks (examples/react_agent.py): task 0 one
valid call then an answer; task 1 a valid call, then a call with wrong arguments, then an answer;
tasks 2-4 an answer in prose at once. On SGLang without a tool parser the calls stay in the reply
text (native: the agent sees them as text and exits 1); the text condition delivers them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from toolproxy import emulators as fakes
from toolproxy.analysis.measure.runline import Share, cause_text
from toolproxy.analysis.measure.stats import wilson
from toolproxy.record.segments import read_records

AGENT = Path(__file__).resolve().parent.parent / "examples" / "react_agent.py"
TASKS = ("(17 * 23) + 11", "42.195 km", "2 to the power of 20", "26.2 miles", "square of 12")


def _model(req: fakes.ModelRequest) -> fakes.ScriptedReply:
    task = next(i for i, t in enumerate(TASKS) if t in json.dumps(req.messages))
    turn = sum(1 for m in req.messages if m.get("role") == "assistant")
    if task == 0 and turn == 0:
        return fakes.call("calculator", {"expression": "(17 * 23) + 11"})
    if task == 1 and turn == 0:
        return fakes.call("unit_convert", {"value": 42.195, "unit": "km"})
    if task == 1 and turn == 1:
        return fakes.call("calculator", {"expr": "26.2"})  # breaks the schema: `expression` is required
    return fakes.text("The answer is 402.")


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "TOOLPROXY_"))}


TOOLPROXY = (sys.executable, "-m", "toolproxy.cli")


def _study(upstream: str, data: Path, *harness: str, name: str = "r", conditions: str = "native,text") -> list[str]:
    options = {"--upstream": upstream, "--data": str(data), "--name": name, "--conditions": conditions}
    harness = harness or (sys.executable, str(AGENT), "--model", "m")
    return [*TOOLPROXY, "study", *(x for pair in options.items() for x in pair), "--no-fingerprint", "--", *harness]


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*TOOLPROXY, *args], text=True, capture_output=True, timeout=240, **kw)


def _headline(k: int, n: int) -> str:
    return Share(k, n, *wilson(k, n)).text()


@pytest.fixture(scope="module")
def studied(tmp_path_factory):
    """The study run once, then run again: (first, second, data directory)."""
    data = tmp_path_factory.mktemp("finishes") / "data"
    fake = fakes.FakeStack("sglang", responder=_model)  # no --tool-call-parser: calls stay in content
    with fake.in_thread():
        first = subprocess.run(_study(fake.url, data), env=_env(), text=True, capture_output=True, timeout=300)
        second = subprocess.run(_study(fake.url, data), env=_env(), text=True, capture_output=True, timeout=300)
    return first, second, data


def test_a_harness_exit_code_is_kept_beside_its_cell_and_a_rerun_continues(studied):
    """react_agent exits 1 when the calls come back as text: that was a failed cell, run again on
    every rerun (react_agent-native~2, ~3 ...). It is the harness's verdict on its tasks: kept
    beside the cell, the cell measured, and a rerun has nothing left to do."""
    first, second, data = studied
    assert first.returncode == 0, first.stderr
    state = json.loads((data / "studies" / "r.json").read_text())
    assert [(p["run"], p["status"], p["exit_code"]) for p in state["runs"]] == [
        ("r-native", "done", 1),
        ("r-text", "done", 0),
    ]
    assert "r-native: the harness exited 1, its own verdict on its tasks" in first.stderr
    assert "| r-native | native | done (harness exited 1) | 5 |" in first.stdout
    assert second.returncode == 0 and "every run is done already" in second.stderr, second.stderr
    assert "~2" not in second.stdout + second.stderr
    runs = {r["run"] for r in read_records(data) if r.get("kind", "exchange") == "exchange"}
    assert runs == {"r-native", "r-text"}


def test_one_headline_per_cell_the_same_in_every_output(studied):
    """The text cell read 86% [49-97] (6/7) in the study's table and "50% (too few episodes); call
    50%" in the tables below it. Now each output leads with the same pooled call fidelity, and any
    other number says what it is where it stands."""
    first, _, data = studied
    text_cell = _headline(2, 3)  # task 0's call and task 1's first; task 1's second broke the schema
    native_cell = _headline(2, 2)  # both valid, neither delivered (left in text)
    row = next(x for x in first.stdout.splitlines() if x.startswith("| r-text | text |"))
    assert f"| {text_cell} | {text_cell} |" in row, row  # call and delivered: the same 2 of 3
    tables = _cli("report", "--data", str(data), "--study", "r").stdout
    assert f"| call {native_cell}; delivered {_headline(0, 2)} | call {text_cell}; delivered {text_cell} |" in tables
    assert tables in first.stdout  # the study prints the same tables
    assert "too few" not in first.stdout and "(as sent)" not in first.stdout and "the harness's model" in tables
    # The per-episode mean (task 0: 1 of 1, task 1: 1 of 2: 75%) differs from the pooled 67%: the
    # report shows it labelled with the episodes it is over, never alone.
    report = _cli("report", "--data", str(data), "--run", "r-text").stdout
    assert "75% (2/5 eps)" in report and report.count("75%") == 1, report
    assert f"{text_cell.split(' (')[0]}" in report  # the pooled headline, with its interval
    compare = " ".join(_cli("compare", "r-native", "r-text", "--data", str(data)).stdout.split())
    assert f"A = r-native: call fidelity {native_cell}, delivered {_headline(0, 2)}" in compare
    assert f"B = r-text: call fidelity {text_cell}, delivered {text_cell}" in compare
    # Items, not turns: three tasks were answered in prose at once under both conditions, so they
    # fail under both; the table says so under it, and what its p means.
    assert "Of the paired items, 3 in A and 3 in B had no turn this metric scores" in compare, compare
    assert "McNemar p 1.0000: how likely a split" in compare and "cannot tell A and B apart" in compare
    analyzed = _cli("analyze", "--data", str(data)).stdout  # "analyzer version 6" meant nothing
    assert "analyzer version " in analyzed and ": the rules that turned these records into outcomes" in analyzed


def test_run_names_are_never_clipped_in_the_terminal_table():
    """`react_agent-native` and `react_agent-native~2` both read `react_agent-nativ…`."""
    from toolproxy.analysis.report.terminal import aligned

    rows = [["react_agent-native", "native", "5"], ["react_agent-native~2", "native", "5"]]
    lines = aligned(["run", "cond", "turns"], rows, 2, width=20)
    assert "react_agent-native " in lines[2] and "react_agent-native~2" in lines[3], lines


def test_an_old_failed_cell_counts_as_done(tmp_path):
    """A state written when a harness's exit marked its cell failed: the cell ran to its end."""
    from toolproxy.drive.study import Study

    plan = Study.plan("r", ["agent"], [(None, "http://127.0.0.1:1")], ["native"], 1)
    path = tmp_path / "r.json"
    plan.save(path)
    doc = json.loads(path.read_text())
    doc["runs"][0].update(status="failed", exit_code=1)
    path.write_text(json.dumps(doc))
    assert [(p.status, p.exit_code) for p in Study.load(path).runs] == [("done", 1)]


def _closed_port() -> tuple[socket.socket, int]:
    """A loopback port bound and not listening: a connection to it is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


MARKING = textwrap.dedent("""
    import pathlib, sys
    pathlib.Path(sys.argv[1]).touch()
""")


def test_a_dead_upstream_runs_no_cell_and_the_corrected_one_resumes(fake_stack, tmp_path):
    """A wrong --upstream port ran every cell, each `connect` errors, and exited 0; the rerun with
    the right port was refused as "another command or plan"."""
    sock, port = _closed_port()
    data = tmp_path / "data"
    with sock:
        dead = subprocess.run(
            _study(f"http://127.0.0.1:{port}", data), env=_env(), text=True, capture_output=True, timeout=120
        )
    assert dead.returncode == 1, dead.stderr
    (line,) = [x for x in dead.stderr.splitlines() if x]
    assert line.startswith(f"toolproxy study: cannot reach the upstream http://127.0.0.1:{port}: nothing is listening")
    assert "No cell was run" in line and "Traceback" not in dead.stderr
    assert not list(read_records(data))  # no harness ran, nothing was sent
    fake = fake_stack("sglang", responder=_model)
    fixed = subprocess.run(_study(fake.url, data), env=_env(), text=True, capture_output=True, timeout=300)
    assert fixed.returncode == 0, fixed.stderr
    state = json.loads((data / "studies" / "r.json").read_text())
    assert [(p["run"], p["status"]) for p in state["runs"]] == [("r-native", "done"), ("r-text", "done")]


def test_run_checks_the_upstream_before_the_harness(tmp_path):
    harness, ran = tmp_path / "mark.py", tmp_path / "ran"
    harness.write_text(MARKING)
    sock, port = _closed_port()
    with sock:
        done = _cli(
            "run",
            "--upstream",
            f"http://127.0.0.1:{port}",
            "--data",
            str(tmp_path / "d"),
            "--",
            sys.executable,
            str(harness),
            str(ran),
            env=_env(),
        )
    assert done.returncode == 1 and not ran.exists(), done.stderr
    assert f"cannot reach the upstream http://127.0.0.1:{port}: nothing is listening" in done.stderr
    assert "The harness was not started." in done.stderr and "Traceback" not in done.stderr


# Two tasks through plain HTTP; the first cell's harness then stops the model server, as a server
# that crashes mid-study would.
STOPPING = textwrap.dedent("""
    import json, os, pathlib, signal, sys, urllib.request, urllib.error
    base = os.environ["OPENAI_BASE_URL"]
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object",
        "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
    for i, task in enumerate(("What is (17 * 23) + 11?", "How many miles is 42.195 km?")):
        body = {"model": "m", "tools": tools, "messages": [{"role": "user", "content": task}]}
        request = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=60).read()
        except urllib.error.HTTPError as exc:
            print("error answer:", exc.code)
    stop = pathlib.Path(sys.argv[1])
    if stop.exists():
        os.kill(int(stop.read_text()), signal.SIGTERM)
        stop.unlink()
""")


def _emulator(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolproxy.emulators", "sglang", "--port", str(port), "--reply", "agent"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert "listening on" in proc.stdout.readline()
    return proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _study_on_emulator(port: int, data: Path, harness: Path, stop: Path, crash: bool) -> subprocess.CompletedProcess:
    """The study against an emulated SGLang on `port`; with crash, the first cell's harness stops it."""
    server = _emulator(port)
    try:
        if crash:
            stop.write_text(str(server.pid))
        return subprocess.run(
            _study(f"http://127.0.0.1:{port}", data, sys.executable, str(harness), str(stop), name="s"),
            env=_env(),
            text=True,
            capture_output=True,
            timeout=300,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def test_an_upstream_that_stops_answering_stops_the_study_and_a_corrected_one_resumes_it(tmp_path):
    harness, stop = tmp_path / "agent.py", tmp_path / "stop"
    harness.write_text(STOPPING)
    data = tmp_path / "data"
    first_port = _free_port()
    cut = _study_on_emulator(first_port, data, harness, stop, crash=True)
    assert cut.returncode == 1, cut.stderr
    assert "s-text: no request got an answer, and cannot reach the upstream" in cut.stderr, cut.stderr
    assert "run the same command again once it answers" in cut.stderr and "Traceback" not in cut.stderr
    state = json.loads((data / "studies" / "s.json").read_text())
    assert [(p["run"], p["status"]) for p in state["runs"]] == [("s-native", "done"), ("s-text", "unreached")]
    second_port = _free_port()
    resumed = _study_on_emulator(second_port, data, harness, stop, crash=False)
    assert resumed.returncode == 0, resumed.stderr
    assert f"the upstream is now http://127.0.0.1:{second_port} (was http://127.0.0.1:{first_port})" in resumed.stderr
    state = json.loads((data / "studies" / "s.json").read_text())
    assert [(p["run"], p["status"], p["attempts"]) for p in state["runs"]] == [
        ("s-native", "done", []),
        ("s-text~2", "done", ["s-text"]),
    ]


def test_a_harness_that_sends_nothing_is_said_and_the_study_exits_1(fake_stack, tmp_path):
    fake = fake_stack("sglang")
    done = subprocess.run(
        _study(fake.url, tmp_path / "data", sys.executable, "-c", "pass"),
        env=_env(),
        text=True,
        capture_output=True,
        timeout=240,
    )
    assert done.returncode == 1, done.stderr
    assert "r-native: no request reached the proxy: the harness never used the address it was given" in done.stderr
    assert done.stderr.rstrip().endswith("no cell's harness sent the proxy a request: nothing was measured")
    one = _cli(
        "run", "--upstream", fake.url, "--data", str(tmp_path / "one"), "--", sys.executable, "-c", "pass", env=_env()
    )
    assert "toolproxy run: no request reached the proxy" in one.stderr


def test_a_study_where_every_turn_was_refused_exits_1_and_says_why(fake_stack, tmp_path):
    fake = fake_stack("no_jinja")  # llama-server --no-jinja refuses every request with tools
    done = subprocess.run(
        _study(fake.url, tmp_path / "data", conditions="native"),
        env=_env(),
        text=True,
        capture_output=True,
        timeout=240,
    )
    assert done.returncode == 1, done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("study r: no cell produced a model turn: nothing was measured of the model (every turn")
    assert "tools param requires --jinja flag" in last


def test_small_words(tmp_path):
    """--condition for --conditions, a data directory that is not there, and a cause without words."""
    wrong = _cli("study", "--upstream", "http://127.0.0.1:9", "--condition", "native,text", "--", "true")
    assert wrong.returncode == 2 and "e.g. --conditions native,text" in wrong.stderr, wrong.stderr
    missing = _cli("report", "--data", str(tmp_path / "nonexistent"))
    assert missing.returncode == 2 and "no data directory at" in missing.stderr and "analyze" not in missing.stderr
    assert cause_text("connect", 1, "connect") == "connect 1: the stack could not be reached (a serving failure)"


def test_the_interrupted_cell_is_named_in_the_tables(tmp_path, fake_stack):
    """After an interrupted try the tables showed the cell as `-` and its test as "a run is missing"."""
    fake = fake_stack("sglang", responder=_model)
    data = tmp_path / "data"
    slow = tmp_path / "slow.py"
    slow.write_text(
        f"import runpy, sys, time\nsys.argv = ['a', '--model', 'm']\nrunpy.run_path({str(AGENT)!r})['main']()\n"
        "print('holding', flush=True)\ntime.sleep(120)\n"
    )
    proc = subprocess.Popen(
        _study(fake.url, data, sys.executable, str(slow)), env=_env(), text=True, stdout=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while proc.stdout.readline().strip() != "holding":
        assert time.monotonic() < deadline
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    tables = _cli("report", "--data", str(data), "--study", "r").stdout
    assert "| interrupted: run the study again to redo it | not run yet |" in tables, tables
    assert "| native: interrupted: run the study again to redo it; text: not run yet |" in tables, tables


def test_a_played_run_has_its_recording_s_provenance(studied, tmp_path):
    """`run --playback` of a run recorded under `text` (toolproxy parsed its calls) said "tool parser
    active (calls arrived as tool_calls) ... the number is the model's": the playback's calls do
    arrive as tool_calls, but they are the recording's, parsed by toolproxy then."""
    import shutil

    _, _, recorded = studied
    data = tmp_path / "data"
    shutil.copytree(recorded, data)
    played = _cli(
        "run", "--playback", "r-text", "--data", str(data), "--", sys.executable, str(AGENT), "--model", "m", env=_env()
    )
    line = next(x for x in played.stderr.splitlines() if x.startswith("- r-text@playback: "))
    assert line.startswith("- r-text@playback: played back from r-text's recording, whose facts these are: "), line
    assert "under the text condition" in line and "tool parser active" not in line, line
    why = played.stderr.split(line, 1)[1].splitlines()[1]
    assert why.startswith("  Why this number: a playback of r-text's recording: no stack ran"), why
    assert "the number is the model's" not in why.split("provenance says:")[0], why
