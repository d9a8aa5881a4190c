"""The progress line: its wording (a table of cases), silence off a terminal, and `analyze` on a pty."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest
from ptyrun import REDRAW, on_a_terminal

from toolproxy.term.progress import Progress, duration, line

CLI = [sys.executable, "-c", "from toolproxy.cli import main; main()"]


@pytest.mark.parametrize(
    "seconds, text", [(0.2, "0s"), (59.4, "59s"), (61, "1m01s"), (3599, "59m59s"), (7800, "2h10m")]
)
def test_duration(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize(
    "args, text",
    [
        (("analyze", 0, 100e6, 0.0, "MB", 1e6), "analyze: 0.0/100.0 MB (0%), 0.0 MB/s"),
        (("analyze", 25e6, 100e6, 5.0, "MB", 1e6), "analyze: 25.0/100.0 MB (25%), 5.0 MB/s, 15s left"),
        (
            ("conformance", 30, 120, 60.0, "requests"),
            "conformance: 30/120 requests (25%), 30.0 requests/min, 3m00s left",
        ),
        (("conformance", 1, 27, 48.0, "requests"), "conformance: 1/27 requests (4%), 1.2 requests/min, 20m48s left"),
        (("replay", 1500, None, 10.0, "turns"), "replay: 1,500 turns, 150 turns/s"),
        (("study", 8, 8, 200.0), "study: 8/8 (100%), 2.4/min, done in 3m20s"),
    ],
)
def test_line(args, text):
    assert line(*args) == text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_silent_when_not_a_terminal_or_quiet():
    piped = io.StringIO()
    with Progress("x", 10, stream=piped) as p:
        p.advance(10)
    assert piped.getvalue() == ""
    tty = _Tty()
    with Progress("x", 10, stream=tty, quiet=True) as p:
        p.advance(10)
    assert tty.getvalue() == ""


def test_redraws_in_place_on_a_terminal():
    tty = _Tty()
    with Progress("work", 4, unit="items", stream=tty, interval=0) as p:
        for _ in range(4):
            p.advance()
    out = tty.getvalue()
    assert out.startswith("\r\x1b[2Kwork: 1/4 items (25%)") and out.endswith("done in 0s\n")
    assert out.count("\r\x1b[2K") == 5 and "\n" not in out[:-1]


def _segments(data):
    seg = data / "segments"
    seg.mkdir(parents=True)
    rec = (
        '{"v":1,"kind":"exchange","id":"%s","started_at":1.0,"method":"POST","path":"/v1/chat/completions",'
        '"status":200,"run":"r1","response_body":"{}","request_body":"{}"}\n'
    )
    (seg / "seg-000001.jsonl").write_text("".join(rec % f"id{i}" for i in range(50)))


def test_analyze_draws_progress_on_a_terminal_only(tmp_path):
    _segments(tmp_path / "d")
    cmd = [*CLI, "analyze", "--data", str(tmp_path / "d")]
    rc, stdout, tty = on_a_terminal(cmd)
    assert rc == 0
    assert REDRAW + b"analyze: reading segments:" in tty and b"(100%)" in tty and b"done in" in tty, tty
    assert REDRAW + b"analyze: turns and episodes: 1/1 runs (100%)" in tty, tty
    assert b"reading segments" not in stdout  # results on stdout stay clean
    rc, _, tty = on_a_terminal([*cmd, "--reclassify"])
    assert rc == 0 and REDRAW + b"analyze: reclassifying: 50/50 exchanges (100%)" in tty, tty
    _segments(tmp_path / "e")
    piped = subprocess.run([*cmd[:-1], str(tmp_path / "e")], capture_output=True, timeout=120)
    assert piped.returncode == 0 and b"reading segments" not in piped.stderr and REDRAW not in piped.stderr


def test_prune_draws_progress_on_a_terminal_only(tmp_path):
    for name in ("d", "e"):
        _segments(tmp_path / name)
        old = time.time() - 3600
        for seg in (tmp_path / name / "segments").iterdir():
            os.utime(seg, (old, old))
    assert (
        subprocess.run([*CLI, "analyze", "--data", str(tmp_path / "d")], capture_output=True, timeout=120).returncode
        == 0
    )
    rc, stdout, tty = on_a_terminal([*CLI, "prune", "--older-than", "1m", "--run", "r1", "--data", str(tmp_path / "d")])
    assert rc == 0 and b"deleted 1 segments" in stdout and b"removed 50 exchanges" in stdout, stdout
    assert REDRAW + b"prune: checking segments:" in tty and b"(100%)" in tty and b"done in" in tty, tty
    assert REDRAW + b"prune: re-deriving runs: 1/1 (100%)" in tty, tty
    piped = subprocess.run(
        [*CLI, "prune", "--older-than", "1m", "--data", str(tmp_path / "e")], capture_output=True, timeout=60
    )
    assert piped.returncode == 0 and b"deleted 1 segments" in piped.stdout and REDRAW not in piped.stderr, piped


def test_free_text_line_and_clear():
    tty = _Tty()
    p = Progress("study", stream=tty)
    p.show("run a: 3 exchanges, 12s")
    p.clear()
    p.clear()
    assert tty.getvalue() == "\r\x1b[2Krun a: 3 exchanges, 12s\r\x1b[2K"
