"""`--memory-limit`: analyze and export of long episodes (100 turns, each resending its whole
history, so the bodies of one partition are ~150 MB) run as the CLI in a subprocess under a hard
address-space cap, and their peak RSS stays near the limit given, far below the partition's
bodies; the bodies read back byte for byte."""

from __future__ import annotations

import hashlib
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import duckdb
import orjson
import pytest
from test_export_pieces import REBUILD

from toolproxy.analysis.store.connection import StoreError, connect, default_db
from toolproxy.analysis.store.memory import parse_memory_limit
from toolproxy.record.segments import read_records
from toolproxy.record.writer import SEGMENT_DIR
from toolproxy.testing import peak
from toolproxy.testing.corpus import episode, interleaved

CLI = [sys.executable, "-m", "toolproxy.cli"]
# Address space, not memory: Python, DuckDB and their threads reserve ~1.5 GB they never touch.
# The cap only turns a runaway into a quick failure instead of swapping the machine.
ADDRESS_SPACE_CAP = 3 << 30
LIMIT = "64MB"
# What analyze or export may hold besides DuckDB's own limit: the interpreter and its modules
# (~90 MB), DuckDB's code, one batch of records or bodies in Python (analyze peaked at 133 MB).
RSS_BOUND_MB = 260


def run_capped(*args: str, tmp: Path) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI under ADDRESS_SPACE_CAP; its result and its own peak RSS in MB (toolproxy.testing.peak)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))

    out = tmp / "peak_kb"
    proc = subprocess.run(
        peak.command(sys.executable, out, *args), capture_output=True, text=True, preexec_fn=cap, timeout=600
    )
    return proc, peak.read_mb(out)


@pytest.fixture(scope="module")
def long_episodes(tmp_path_factory) -> tuple[Path, int]:
    """Ten concurrent 100-turn episodes of one run and day (one partition); their request bodies' bytes."""
    data = tmp_path_factory.mktemp("long") / "data"
    records = interleaved([episode(random.Random(n), n, 100, 3000) for n in range(10)])
    (data / SEGMENT_DIR).mkdir(parents=True)
    with open(data / SEGMENT_DIR / "20261129T120000-1-0001-host.jsonl", "wb") as f:
        for rec in records:
            f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
    proc, rss = run_capped("analyze", "--data", str(data), "--memory-limit", LIMIT, "--quiet", tmp=data.parent)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert rss < RSS_BOUND_MB, f"analyze peaked at {rss:.0f} MB under --memory-limit {LIMIT}"
    return data, sum(len(r.request_body) for r in records)


def test_export_of_long_episodes_stays_near_the_memory_limit(long_episodes, tmp_path: Path):
    data, body_bytes = long_episodes
    assert body_bytes > 2 * parse_memory_limit(LIMIT)  # a partition written at once cannot fit the limit
    out = tmp_path / "out"
    proc, rss = run_capped(
        "export", "--data", str(data), "--out", str(out), "--memory-limit", LIMIT, "--quiet", tmp=tmp_path
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
    assert rss < RSS_BOUND_MB, f"export peaked at {rss:.0f} MB under --memory-limit {LIMIT}"
    files = list((out / "exchanges").rglob("*.parquet"))
    assert len(files) > 1  # one partition, written in batches
    recorded = {
        r["id"]: (
            hashlib.md5(r["request_body"].encode()).hexdigest(),
            hashlib.md5(r["response_body"].encode()).hexdigest(),
        )
        for r in read_records(data)
    }
    exported = (
        duckdb.connect()
        .execute(f"SELECT id, md5(request_body), md5(response_body) FROM read_parquet('{out}/exchanges/**/*.parquet')")
        .fetchall()
    )
    assert len(exported) == len(recorded) == 1000
    assert {i: (a, b) for i, a, b in exported} == recorded


def test_export_in_pieces_of_long_episodes_stays_near_the_memory_limit(long_episodes, tmp_path: Path):
    """--layout pieces splits each batch's bodies and keeps the hashes written in DuckDB, not Python."""
    data, _ = long_episodes
    out = tmp_path / "out"
    proc, rss = run_capped(
        "export",
        "--layout",
        "pieces",
        "--data",
        str(data),
        "--out",
        str(out),
        "--memory-limit",
        LIMIT,
        "--quiet",
        tmp=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
    assert rss < RSS_BOUND_MB, f"export --layout pieces peaked at {rss:.0f} MB under --memory-limit {LIMIT}"
    recorded = {r["id"]: hashlib.md5(r["request_body"].encode()).hexdigest() for r in read_records(data)}
    rebuilt = (
        duckdb.connect()
        .execute(f"SELECT id, md5(request_body) FROM ({REBUILD.format(col='request', out=out)})")
        .fetchall()
    )
    assert dict(rebuilt) == recorded and len(recorded) == 1000


def test_a_second_export_after_new_traffic_appends_in_batches_too(long_episodes, tmp_path: Path):
    """New rows of a partition already exported are written beside its files, in batches as well."""
    data, _ = long_episodes
    copy = tmp_path / "data"
    subprocess.run(["cp", "-r", str(data), str(copy)], check=True)
    out = tmp_path / "out"
    assert (
        run_capped("export", "--data", str(copy), "--out", str(out), "--memory-limit", LIMIT, "--quiet", tmp=tmp_path)[
            0
        ].returncode
        == 0
    )
    more = interleaved([episode(random.Random(100 + n), 100 + n, 100, 3000) for n in range(2)])
    with open(copy / SEGMENT_DIR / "20261129T130000-1-0002-host.jsonl", "wb") as f:
        for rec in more:
            f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
    assert (
        run_capped("analyze", "--data", str(copy), "--memory-limit", LIMIT, "--quiet", tmp=tmp_path)[0].returncode == 0
    )
    proc, rss = run_capped(
        "export", "--data", str(copy), "--out", str(out), "--memory-limit", LIMIT, "--quiet", tmp=tmp_path
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert rss < RSS_BOUND_MB
    ids = (
        duckdb.connect()
        .execute(f"SELECT count(*), count(DISTINCT id) FROM read_parquet('{out}/exchanges/**/*.parquet')")
        .fetchone()
    )
    assert ids == (1200, 1200)


@pytest.mark.parametrize("command", [["analyze"], ["report"], ["compare", "a", "b"], ["export", "--out", "OUT"]])
@pytest.mark.parametrize(
    "value, message",
    [
        ("lots", "is not a memory size"),
        ("1GB'; DROP TABLE exchanges; --", "is not a memory size"),
        ("10MB", "below the 64MB"),
        ("0%", "between 0% and 100%"),
        ("\x1b[31m1GB", "is not a memory size"),
    ],
)
def test_a_bad_memory_limit_is_a_usage_error(
    long_episodes, tmp_path: Path, command: list[str], value: str, message: str
):
    data, _ = long_episodes
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    proc = subprocess.run([*CLI, *args, "--data", str(data), "--memory-limit", value], capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr and "--memory-limit" in proc.stderr
    assert "Traceback" not in proc.stderr and "\x1b" not in proc.stderr


def test_the_environment_sets_the_limit(long_episodes):
    data, _ = long_episodes
    proc = subprocess.run(
        [*CLI, "report", "--data", str(data)],
        capture_output=True,
        text=True,
        env=os.environ | {"TOOLPROXY_MEMORY_LIMIT": "nonsense"},
    )
    assert proc.returncode == 2 and "is not a memory size" in proc.stderr


def test_duckdb_spills_beside_the_database_and_keeps_the_limit(tmp_path: Path):
    """A writer is an in-memory catalog with the file attached, whose own default temp directory is
    `.tmp` in the current directory; reader and writer both spill beside the file instead."""
    db = default_db(tmp_path)
    for read_only in (False, True):
        con = connect(db, read_only=read_only, memory_limit="25%")
        try:
            spill, limit = con.execute(
                "SELECT current_setting('temp_directory'), current_setting('memory_limit')"
            ).fetchone()
        finally:
            con.close()
        assert spill == f"{db.absolute()}.tmp"
        assert limit.endswith("GiB") or limit.endswith("MiB")
    with pytest.raises(StoreError, match="is not a memory size"):
        connect(db, memory_limit="1 GB or so")
