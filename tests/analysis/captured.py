"""Traffic captured from real harnesses (tests/data/...), analysed the way a user analyses it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolproxy.analysis.store.connection import connect


def analyzed(tmp_path: Path, segments: Path, expect_summary: str | None = None):
    """`toolproxy analyze` over a copy of these segments; a read-only connection to its store."""
    data = tmp_path / "data"
    shutil.copytree(segments, data / "segments")
    r = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "analyze", "--data", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert expect_summary is None or expect_summary in r.stdout, r.stdout
    return connect(data / "toolproxy.duckdb", read_only=True)


def stores_fixture(data: Path):
    """A module-scoped fixture: a function opening each capture under `data` analysed once (by its
    path under `data`); the stores are closed at the end of the module."""

    @pytest.fixture(scope="module")
    def stores(tmp_path_factory):
        opened = {}
        try:
            yield (
                lambda path: (
                    opened.get(path)
                    or opened.setdefault(
                        path, analyzed(tmp_path_factory.mktemp(path.replace("/", "-")), data / path / "segments")
                    )
                )
            )
        finally:
            for con in opened.values():
                con.close()

    return stores


def by_episode(rows) -> list[list[tuple]]:
    """(episode_key, *turn) rows in request order -> the turns of each episode, episodes in order."""
    episodes: dict[str, list] = {}
    for key, *turn in rows:
        episodes.setdefault(key, []).append(tuple(turn))
    return list(episodes.values())
