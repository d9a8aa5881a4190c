"""The tree as the project's linter and formatter leave it: `ruff check` and `ruff format --check`
over the repository (configured in pyproject.toml), so a lint or format error fails the suite, and
so `.ci/run`, not only a developer who remembered to run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess:
    # The test extra pins ruff; the module form finds the one installed beside this interpreter.
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_tree_passes_the_linter():
    r = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_tree_is_formatted():
    r = _ruff("format", "--no-cache", "--check", ".")
    assert r.returncode == 0, f"run `ruff format .`:\n{r.stdout}{r.stderr}"
