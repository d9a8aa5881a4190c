"""`toolproxy study`: one real harness (the openai SDK) under several conditions, resumable."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
from proxyprocess import together

from toolproxy import emulators as fakes
from toolproxy.record.segments import read_records

# Three tasks, each a call then an answer from the tool's result; the harness only acts on
# structured tool_calls, as most do.
HARNESS = textwrap.dedent("""
    import os, sys, time
    from openai import OpenAI
    client = OpenAI()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}}]
    for city in ("Paris", "Lima", "Oslo"):
        messages = [{"role": "user", "content": f"Weather in {city}?"}]
        for _ in range(3):
            reply = client.chat.completions.create(model=os.environ["MODEL"], messages=messages, tools=tools)
            msg = reply.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            for c in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": c.id, "content": "sunny, 21C"})
    if os.path.exists(os.environ.get("HOLD", "")):
        print("holding", flush=True)
        time.sleep(60)
""")


def _responder(req: fakes.ModelRequest) -> fakes.ScriptedReply:
    last = (req.messages or [{}])[-1]
    if last.get("role") == "tool" or "sunny, 21C" in str(last.get("content")):
        return fakes.text("It is sunny and 21C.")
    city = str(last.get("content", "")).split()[-1].rstrip("?")
    return fakes.call("get_weather", {"city": city})


@pytest.fixture
def setup(fake_stack, tmp_path):
    fake = fake_stack("sglang", responder=_responder)  # no --tool-call-parser: calls stay in content
    harness = tmp_path / "agent.py"
    harness.write_text(HARNESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(MODEL=fake.model, HOLD=str(tmp_path / "hold"))
    return fake, harness, env, tmp_path / "data"


def _study(fake, harness, data, *extra):
    return [
        sys.executable,
        "-m",
        "toolproxy.cli",
        "study",
        "--upstream",
        fake.url,
        "--data",
        str(data),
        "--name",
        "s",
        "--conditions",
        "native,text",
        "--no-fingerprint",
        *extra,
        "--",
        sys.executable,
        str(harness),
    ]


def test_study_runs_each_condition_and_pairs_them(setup):
    fake, harness, env, data = setup
    done = subprocess.run(_study(fake, harness, data), env=env, text=True, capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr
    state = json.loads((data / "studies" / "s.json").read_text())
    assert [(r["run"], r["status"]) for r in state["runs"]] == [("s-native", "done"), ("s-text", "done")]
    by_run = {}
    for r in read_records(data):
        if r.get("kind", "exchange") == "exchange":
            by_run.setdefault((r["run"], r["condition"]), 0)
            by_run[(r["run"], r["condition"])] += 1
    # native: the call stays in content, so the harness stops after one turn per task;
    # text: the proxy hands it tool_calls, so each task is a call and an answer.
    assert by_run == {("s-native", "native"): 3, ("s-text", "text"): 6}
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if "| done |" in line}
    assert "| 100% [" in rows["s-native"]  # call fidelity: the model made its calls ...
    assert rows["s-native"].count("| 0% [") == 1  # ... none delivered
    assert rows["s-text"].count("| 100% [") == 2  # text restores delivery
    pairs = [line for line in done.stdout.splitlines() if line.startswith("| s-text | delivered")]
    assert pairs and pairs[0].split("|")[3:6] == [" 3 ", " 0 ", " 3 "]  # 3 paired items, 0 native-only, 3 text-only
    assert (data / "studies" / "s.md").read_text() == done.stdout

    again = subprocess.run(_study(fake, harness, data), env=env, text=True, capture_output=True, timeout=180)
    assert again.returncode == 0 and "every run is done already" in again.stderr
    assert sum(1 for r in read_records(data) if r.get("kind", "exchange") == "exchange") == 9  # nothing rerun


def test_ctrl_c_keeps_finished_runs_and_a_rerun_resumes(setup):
    fake, harness, env, data = setup
    hold = env["HOLD"]
    open(hold, "w").close()
    proc = subprocess.Popen(
        _study(fake, harness, data), env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.readline().strip() == "holding"  # the first condition's harness finished its tasks
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err
    state = json.loads((data / "studies" / "s.json").read_text())
    assert [r["status"] for r in state["runs"]] == ["interrupted", "pending"]

    os.unlink(hold)
    done = subprocess.run(_study(fake, harness, data), env=env, text=True, capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr
    state = json.loads((data / "studies" / "s.json").read_text())
    assert [(r["run"], r["status"], r["attempts"]) for r in state["runs"]] == [
        ("s-native~2", "done", ["s-native"]),
        ("s-text", "done", []),
    ]
    assert "| s-native~2 | native | done |" in done.stdout


def test_unknown_condition_is_a_usage_error(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "study",
            "--upstream",
            "http://127.0.0.1:9",
            "--data",
            str(tmp_path),
            "--conditions",
            "native,nope",
            "--",
            "true",
        ],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2 and "nope" in done.stderr and "Traceback" not in done.stderr


def test_progress_line_on_a_terminal_only(setup):
    """While a run's harness works: its exchanges, their rate and the study's time left, on a
    terminal only (the harness here takes a few seconds, so the line is redrawn)."""
    from ptyrun import REDRAW, on_a_terminal

    fake, harness, env, data = setup
    slow = harness.with_name("slow.py")
    slow.write_text(f"import runpy, time\nrunpy.run_path({str(harness)!r})\ntime.sleep(1.5)\n")
    (rc, stdout, tty), piped = together(  # the terminal and the pipe side by side, each in its own data dir
        lambda: on_a_terminal(_study(fake, slow, data), env=env),
        lambda: subprocess.run(_study(fake, slow, data.with_name("piped")), env=env, capture_output=True, timeout=180),
    )
    assert rc == 0, tty
    assert re.search(rb"\r\x1b\[2K  s-native: \d+ exchanges in \ds \([\d.]+/min\)", tty), tty
    assert re.search(rb"\r\x1b\[2K  s-text: \d+ exchanges in \ds \([\d.]+/min\), study about \S+ left", tty), tty
    assert REDRAW not in stdout
    assert piped.returncode == 0 and REDRAW not in piped.stderr and b"/min)" not in piped.stderr, piped.stderr


def test_the_proxy_address_is_printed_first(setup):
    fake, harness, env, data = setup
    done = subprocess.run(
        _study(fake, harness, data, "--conditions", "native"), env=env, text=True, capture_output=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert re.fullmatch(
        rf"toolproxy study: proxy on http://127\.0\.0\.1:(\d+) -> upstream {re.escape(fake.url)}; "
        r"live page http://127\.0\.0\.1:\1/_toolproxy/",
        first,
    ), first


def test_the_default_name_is_the_harness_s(setup):
    """Not a fixed "study", which printed as `study study: study-native ...`."""
    fake, harness, env, data = setup
    argv = _study(fake, harness, data, "--conditions", "native")
    del argv[argv.index("--name") : argv.index("--name") + 2]
    done = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert (data / "studies" / "agent.json").is_file()  # the harness is agent.py
    assert "| agent-native | native | done |" in done.stdout
    assert "study study" not in done.stderr and "study agent: agent-native" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "command, name",
    [
        (["python", "examples/react_agent.py", "--model", "m"], "react_agent"),
        (["python3.11", "-m", "mypkg.agent"], "mypkg.agent"),
        (["uv", "run", "agent.py"], "agent"),
        (["/usr/bin/env", "FOO=1", "python", "x.py"], "x"),
        (["mini-swe-agent", "--task", "t"], "mini-swe-agent"),
        (["./my agent.sh"], "my-agent"),
        (["python"], "study"),
    ],
)
def test_harness_name(command, name):
    from toolproxy.drive.study import harness_name

    assert harness_name(command) == name


def test_a_model_name_is_shown_inert_and_one_too_long_for_the_request_line_is_refused(setup):
    """The cell line printed --model as given (control characters acted on the terminal); a
    9,000-character name put the tag prefix past the request-line limit, so every request was a
    400 from the HTTP parser while the study exited 0."""
    fake, harness, env, data = setup
    done = subprocess.run(
        _study(fake, harness, data, "--conditions", "native", "--model", "m\x1b[2J\x07x"),
        env=env,
        text=True,
        capture_output=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert re.search(r"study s: s-m_2J_x-native \(model m.*2J.*x, condition native\); 0/1 cells done", done.stderr), (
        done.stderr
    )
    assert [s.json()["model"] for s in fake.seen][:1] == ["m\x1b[2J\x07x"]  # sent as given, only shown inert
    long = subprocess.run(
        _study(fake, harness, data.with_name("long"), "--conditions", "native", "--model", "m" * 9000),
        env=env,
        text=True,
        capture_output=True,
        timeout=180,
    )
    assert long.returncode == 2 and "characters of the request line, which holds 8,190 in all" in long.stderr, (
        long.stderr
    )
    assert "Traceback" not in long.stderr and not data.with_name("long").exists()  # refused before anything ran
