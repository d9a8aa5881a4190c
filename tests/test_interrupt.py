"""Ctrl-C at the terminal while `toolproxy run` or `study` has a request in flight: the user stopped
it, so the harness is interrupted once (no traceback), and the cut exchange is recorded and
counted as the user's (`user_interrupt`), never as a serving failure."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from ptyrun import Terminal

from toolproxy.emulators import stall
from toolproxy.record.segments import read_records

AGENT = Path(__file__).resolve().parent.parent / "examples" / "react_agent.py"


def _wait_for_request(fake, timeout: float = 120.0) -> None:
    """Until the harness's first request is at the stack (which holds it): it is in flight."""
    deadline = time.monotonic() + timeout
    while not any(s.path.endswith("/chat/completions") for s in fake.seen):
        assert time.monotonic() < deadline, "the harness's request never reached the stack"
        time.sleep(0.05)


@pytest.mark.parametrize("command", ["run", "study"])
def test_ctrl_c_interrupts_the_harness_once_and_the_cut_request_is_the_user_s(fake_stack, tmp_path, command):
    fake = fake_stack("llamacpp")
    fake.inject(stall(before=120, times=None))  # the model takes its time: Ctrl-C comes mid-request
    data = tmp_path / "data"
    how = ["--run", "r"] if command == "run" else ["--name", "s", "--conditions", "native"]
    cmd = [sys.executable, "-m", "toolproxy.cli", command, "--upstream", fake.url, "--data", str(data), *how]
    cmd += ["--no-fingerprint", "--", sys.executable, str(AGENT), "--model", "m", "--episodes", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TOOLPROXY_"))}
    term = Terminal(cmd, env=env, controlling=True)
    try:
        _wait_for_request(fake)
        term.interrupt()
    finally:
        rc = term.finish(timeout=240)
    shown = term.seen.decode(errors="replace")
    assert rc == 130, shown
    # The harness got one SIGINT (the terminal's), not a second one passed on by toolproxy: it says
    # it was interrupted and exits, no traceback from it or from toolproxy.
    assert "react_agent: interrupted" in shown and "Traceback" not in shown and "KeyboardInterrupt" not in shown
    (cut,) = [r for r in read_records(data) if r.get("kind", "exchange") == "exchange"]
    assert cut["error_kind"] == "user_interrupt", cut["error_kind"]
    assert cut["error_message"].startswith("the user interrupted the harness (SIGINT) while this exchange was in")
    # Counted as the user's, in the words every report uses.
    if command == "run":
        line = next(x for x in shown.splitlines() if x.startswith("run r: "))
    else:
        line = next(x for x in shown.splitlines() if x.startswith("| s-native |"))
    assert "user_interrupt 1: the user interrupted the harness" in line, line
    assert "(the user's doing, not a serving failure)" in line and "a serving failure)" not in line.replace(
        "not a serving failure)", ""
    ), line
