"""A derive of several batches in steps (episodes.derive, `in_steps`): each batch's attempts are
pointed at their turns and committed on their own, so a large run's updates never sit in one
transaction. The result is row for row what one transaction gives, and an analyze that fails
between steps leaves its runs marked unfinished and rowless: reports refuse the store until the
next analyze, which derives them whole."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from test_threads import CAPTURES, _tables

from toolproxy.analysis.episodes import derive
from toolproxy.analysis.lifecycle.ingest import ingest
from toolproxy.analysis.store.connection import connect, default_db
from toolproxy.analysis.store.state import unfinished_runs
from toolproxy.record.segments import SEGMENT_DIR
from toolproxy.testing.corpus import generate_long

CLI = [sys.executable, "-m", "toolproxy.cli"]
BATCH = 300  # attempts per batch: the corpus below derives in about ten


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict]:
    """Untagged interleaved episodes in one run (split into threads) and tagged ones in another
    (split by episode), and the tables one derive transaction gives them."""
    data = tmp_path_factory.mktemp("steps") / "data"
    generate_long(data / "a", 1500, seed=4, concurrent=8, tagged=False)
    generate_long(data / "b", 1200, seed=6, concurrent=8)
    (data / SEGMENT_DIR).mkdir(parents=True)
    for part in ("a", "b"):
        for seg in (data / part / SEGMENT_DIR).iterdir():
            seg.rename(data / SEGMENT_DIR / f"{seg.stem}-{part}.jsonl")
        shutil.rmtree(data / part)
    once = data.parent / "once"
    shutil.copytree(data / SEGMENT_DIR, once / SEGMENT_DIR)
    con = connect(default_db(once))
    ingest(con, once, workers=0)
    tables = _tables(con)
    con.close()
    return data, tables


def _copy(corpus: tuple[Path, dict], to: Path) -> Path:
    shutil.copytree(corpus[0] / SEGMENT_DIR, to / SEGMENT_DIR)
    return to


def test_a_derive_in_steps_gives_what_one_transaction_gives(corpus, tmp_path: Path, monkeypatch):
    data = _copy(corpus, tmp_path / "data")
    monkeypatch.setattr(derive, "_BATCH_ATTEMPTS", BATCH)
    commits = []
    step = derive._commit_step
    monkeypatch.setattr(derive, "_commit_step", lambda con: (commits.append(1), step(con)))
    con = connect(default_db(data))
    ingest(con, data, workers=0)
    assert len(commits) >= 8  # the deletes, then each batch
    assert _tables(con) == corpus[1]
    assert unfinished_runs(con) == []
    con.close()
    report = subprocess.run(
        [*CLI, "report", "--data", str(data), "--format", "json"], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr


def test_every_capture_derived_a_batch_per_attempt_in_steps_is_derived_as_in_one(tmp_path: Path, monkeypatch):
    """The real-harness captures, a commit after every attempt's batch, against one transaction."""
    stepped = 0
    for n, capture in enumerate(CAPTURES):
        once, steps = tmp_path / f"{n}-once", tmp_path / f"{n}-steps"
        for d in (once, steps):
            shutil.copytree(capture / "segments", d / SEGMENT_DIR)
        con = connect(default_db(once))
        ingest(con, once, workers=0)
        want = _tables(con)
        con.close()
        commits = []
        step = derive._commit_step
        monkeypatch.setattr(derive, "_BATCH_ATTEMPTS", 1)
        monkeypatch.setattr(
            derive, "_commit_step", lambda con, commits=commits, step=step: (commits.append(1), step(con))
        )
        con = connect(default_db(steps))
        ingest(con, steps, workers=0)
        assert _tables(con) == want, capture.name
        assert unfinished_runs(con) == []
        con.close()
        monkeypatch.undo()
        stepped += bool(commits)
    # A capture of one run grouped whole is one batch, no step (most coding agents' captures are one
    # task): the harness captures of many episodes must step.
    assert stepped >= 10, stepped


def test_a_derive_failing_between_steps_is_derived_whole_by_the_next_analyze(corpus, tmp_path: Path, monkeypatch):
    data = _copy(corpus, tmp_path / "data")
    monkeypatch.setattr(derive, "_BATCH_ATTEMPTS", BATCH)

    def fail(con, runs):
        raise RuntimeError("killed after the last step")

    monkeypatch.setattr(derive, "_finish", fail)
    con = connect(default_db(data))
    with pytest.raises(RuntimeError):
        ingest(con, data, workers=0)
    con.close()
    con = duckdb.connect(str(default_db(data)), read_only=True)
    runs = sorted(r for (r,) in con.execute("SELECT DISTINCT run FROM exchanges").fetchall())
    assert unfinished_runs(con) == runs
    # every batch's turns were committed, but no run has its row
    assert con.execute("SELECT count(*) FROM turns").fetchone()[0] > 1000
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    con.close()
    report = subprocess.run(
        [*CLI, "report", "--data", str(data), "--format", "json"], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 2 and report.stdout == ""
    assert "an analyze stopped while deriving 2 run(s) ((untagged), bench)" in report.stderr
    assert "run `toolproxy analyze`" in report.stderr and "Traceback" not in report.stderr
    monkeypatch.undo()
    con = connect(default_db(data))
    summary = ingest(con, data, workers=0)
    assert summary.new_exchanges == 0 and summary.runs == runs and summary.runs_in_part == []
    assert _tables(con) == corpus[1]
    assert unfinished_runs(con) == []
    con.close()
    report = subprocess.run(
        [*CLI, "report", "--data", str(data), "--format", "json"], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr
