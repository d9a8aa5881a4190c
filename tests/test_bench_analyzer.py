"""The analyzer benchmark's long-episode mix, its held-back re-analyze, its read_json floor and its
timing of the commands users run on the store run end to end on a small data dir, and say what
they measured."""

from __future__ import annotations

import re
import subprocess
import sys

from benchrun import CHECKOUT


def test_long_mix_with_more_records_and_the_floor():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.analyzer",
            "--exchanges",
            "400",
            "--mix",
            "long",
            "--more",
            "40",
            "--floor",
            "--workers",
            "0",
            "--commands",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=CHECKOUT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"generated 360 exchanges, mix long \(\d+ MB of segments\)", r.stdout)
    assert "runs re-derived: 1 (bench)" in r.stdout  # the fresh analyze derives the run whole
    assert re.search(
        r"\+40 records, re-analyze .*: [\d.]+s wall, [\d.]+s CPU \([\d.]+ of the fresh analyze's\), "
        r"peak RSS \d+ MB; derived in part: 1 of those runs, only their \d+ episodes",
        r.stdout,
    )
    floor = re.search(r"floor: DuckDB read_json into a table \((\d+) rows, (\d+) columns\)", r.stdout)
    assert floor and floor.group(1) == "360" and int(floor.group(2)) > 20
    assert re.search(r"analyze [\d.]+x its CPU", r.stdout)
    assert "re-run: segments: 2 (0 with new data" in r.stdout
    _commands_timed(r.stdout, compared=None)


def test_the_commands_compare_the_two_runs_sharing_the_most_items():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.analyzer",
            "--exchanges",
            "600",
            "--mix",
            "agents",
            "--workers",
            "0",
            "--commands",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=CHECKOUT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    _commands_timed(r.stdout, compared=r"\S+ \S+")


def _commands_timed(out: str, compared: str | None) -> None:
    timed = r" .*: [\d.]+s wall, [\d.]+s CPU, peak RSS [1-9]\d* MB"
    for name in ("report", "export --layout whole", "export --layout pieces"):
        assert re.search("^" + re.escape(name) + timed, out, re.M), (name, out)
    if compared is None:
        assert re.search(r"^compare .*: not timed, no two runs share an item$", out, re.M), out
    else:
        assert re.search(r"^compare " + compared + timed, out, re.M), out
