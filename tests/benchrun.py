"""Runs a benchmark module the way a user does from a checkout (`python -m benchmarks.NAME`),
since `benchmarks/` is outside the wheel: the shared part of the benchmarks' smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def run_benchmark(module: str, args: list[str], out: Path, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    """The finished run and the JSON it wrote to `out`; fails the test, with its output, if it did not finish."""
    r = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=CHECKOUT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r, json.loads(out.read_text())
