"""examples/bfcl_study.py --dry-run: one study per category, each tagged with what its items are due."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "bfcl_study.py"


def test_each_category_is_a_study_tagged_with_its_expectation(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--upstream",
            "http://127.0.0.1:9",
            "--dry-run",
            "--data",
            str(tmp_path / "d"),
            "--categories",
            "simple_python,irrelevance,live_irrelevance",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3
    expected = {"simple_python": "call", "irrelevance": "none", "live_irrelevance": "none"}
    for line, (category, expect) in zip(lines, expected.items()):
        argv = shlex.split(line)
        assert argv[0] == f"BFCL_PROJECT_ROOT={(tmp_path / 'd' / 'bfcl' / category).resolve()}"
        assert argv[argv.index("--name") + 1] == f"bfcl-{category}"
        tags = [argv[i + 1] for i, a in enumerate(argv) if a == "--tag"]
        assert tags == [f"category={category}", f"expect={expect}"]
        assert argv[-1] == category and argv[-3:-1] == ["--first", "10"]
    assert not (tmp_path / "d").exists()  # a dry run creates nothing


def test_an_unknown_category_is_refused():
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--upstream",
            "http://127.0.0.1:9",
            "--dry-run",
            "--categories",
            "simple_python,multi_turn_base",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "not a single-turn BFCL category: multi_turn_base" in done.stderr
