"""The analyzer benchmark's long-episode mix, its held-back re-analyze and its read_json floor run
end to end on a small data dir, and say what they measured."""

from __future__ import annotations

import re
import subprocess
import sys

from benchrun import CHECKOUT


def test_long_mix_with_more_records_and_the_floor():
    r = subprocess.run([sys.executable, "-m", "benchmarks.analyzer", "--exchanges", "400", "--mix", "long", "--more", "40",
                        "--floor", "--workers", "0"], capture_output=True, text=True, timeout=600, cwd=CHECKOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"generated 360 exchanges, mix long \(\d+ MB of segments\)", r.stdout)
    assert "runs re-derived: 1 (bench)" in r.stdout  # the fresh analyze derives the run whole
    assert re.search(r"\+40 records, re-analyze .*: [\d.]+s wall, [\d.]+s CPU \([\d.]+ of the fresh analyze's\), "
                     r"peak RSS \d+ MB; derived in part: 1 of those runs, only their \d+ episodes", r.stdout)
    floor = re.search(r"floor: DuckDB read_json into a table \((\d+) rows, (\d+) columns\)", r.stdout)
    assert floor and floor.group(1) == "360" and int(floor.group(2)) > 20
    assert re.search(r"analyze [\d.]+x its CPU", r.stdout)
    assert "re-run: segments: 2 (0 with new data" in r.stdout
