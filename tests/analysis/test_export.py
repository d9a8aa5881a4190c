"""`toolproxy export --format parquet`: real segments analysed by the CLI, exported to a local
directory and to fsspec's in-memory filesystem, read back by DuckDB with hive partitioning."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import duckdb
import fsspec
import orjson
import pytest
from ptyrun import REDRAW, on_a_terminal

from toolproxy.analysis.export import parquet
from toolproxy.analysis.export.destination import Destination, ExportError
from toolproxy.analysis.export.partitions import MAX_ENCODED, _quote, encode_value, partition_path
from toolproxy.analysis.store.connection import connect
from toolproxy.record.model import Record, encode_body, new_id
from toolproxy.record.segments import read_records
from toolproxy.record.writer import SEGMENT_DIR
from toolproxy.testing.corpus import generate

TABLES = ("exchanges", "calls", "turns", "episodes", "runs")
DAY = 86400.0
HOSTILE = [
    "a/b",
    "..",
    ".",
    "../../escape",
    "x\x01y\x1b[31m",
    "é🙂 run",
    "%41",
    "A=B",
    "run=x/date=y",
    "",
    "1234",
    "__HIVE_DEFAULT_PARTITION__",
    "long-" * 100,
]
CLI = [sys.executable, "-m", "toolproxy.cli"]


def _record(run: str, t: float, n: int, text: str | None = None, episode: str | None = None) -> bytes:
    rec = Record(
        id=new_id(),
        started_at=t,
        upstream="http://127.0.0.1:9",
        method="POST",
        path="/v1/chat/completions",
        client_path="/v1/chat/completions",
        run=run,
        episode=episode or f"ep{n}",
        item=f"item{n}",
    )
    req = orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": f"task {n}"}],
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        }
    )
    rec.request_body, rec.request_body_encoding = encode_body(req)
    rec.request_body_size = len(req)
    message = (
        {"role": "assistant", "content": text}
        if text is not None
        else {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}],
        }
    )
    body = orjson.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {"index": 0, "message": message, "finish_reason": "stop" if text is not None else "tool_calls"}
            ],
        }
    )
    rec.status = rec.client_status = 200
    rec.response_headers = [["content-type", "application/json"]]
    rec.response_body, rec.response_body_encoding = encode_body(body)
    rec.response_complete = True
    rec.ttfb_ms, rec.duration_ms, rec.ended_at = 5.0, 9.0, t + 0.009
    return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)


def write_segment(data: Path, name: str, rows: list[tuple[str, float]]) -> None:
    seg = data / SEGMENT_DIR
    seg.mkdir(parents=True, exist_ok=True)
    with open(seg / f"{name}.jsonl", "wb") as f:
        for n, (run, t) in enumerate(rows):
            f.write(_record(run, t, n, text=None if n % 3 else "I would rather answer in prose."))


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
    return proc


def analyze(data: Path, *extra: str) -> None:
    run_cli("analyze", "--data", str(data), *extra)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Mixed-stack traffic on one day, and hostile run names over three days."""
    data = tmp_path_factory.mktemp("export") / "data"
    generate(data, 400)
    t0 = dt.datetime(2026, 11, 28, 23, 59, 58, tzinfo=dt.UTC).timestamp()
    write_segment(
        data, "20261128T235958-2-0001", [(run, t0 + i * 0.5 + (i % 3) * DAY) for i, run in enumerate(HOSTILE * 3)]
    )
    analyze(data)
    return data


def as_hive(run: str) -> str:
    """The run a hive-partitioned reader sees: the name itself, or the shortened spelling of an
    overlong one (whose exact name stays in the files' `run` column)."""
    encoded = encode_value(run)
    return run if len(_quote(run)) <= MAX_ENCODED else unquote(encoded)


def db_counts(db: Path) -> dict:
    """The analysis database's counts, with run names as a hive-partitioned read gives them."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = _counts(con, "{t}")
    finally:
        con.close()
    for key in ("outcomes", "turn_outcomes"):
        out[key] = sorted((as_hive(r[0]), *r[1:]) for r in out[key])
    return out


def _counts(con, source: str) -> dict:
    out = {t: con.execute(f"SELECT count(*) FROM {source.format(t=t)}").fetchone()[0] for t in TABLES}
    out["outcomes"] = sorted(
        con.execute(f"SELECT run, outcome, count(*) FROM {source.format(t='exchanges')} GROUP BY ALL").fetchall()
    )
    out["turn_outcomes"] = sorted(
        con.execute(f"SELECT run, outcome, role, count(*) FROM {source.format(t='turns')} GROUP BY ALL").fetchall()
    )
    out["ids"] = con.execute(f"SELECT count(DISTINCT id) FROM {source.format(t='exchanges')}").fetchone()[0]
    return out


def parquet_counts(root: str, con=None) -> dict:
    con = con or duckdb.connect()
    return _counts(con, f"read_parquet('{root}/{{t}}/**/*.parquet', hive_partitioning=true)")


def files_with_mtimes(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def data(tmp_path: Path, data_dir: Path) -> Path:
    """A private copy of the analysed data dir (a test may add traffic or re-analyse)."""
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    return copy


@pytest.mark.parametrize(
    "name, encoded",
    [
        ("plain-run_1", "plain-run_1"),
        ("a/b", "a%2Fb"),
        ("..", "%2E%2E"),
        ("x\x01", "x%01"),
        ("é", "%C3%A9"),
        ("%41", "%2541"),
        ("A=B", "A%3DB"),
        ("", ""),
        ("__HIVE_DEFAULT_PARTITION__", "%5F%5FHIVE%5FDEFAULT%5FPARTITION%5F%5F"),
    ],
)
def test_partition_names_are_reversible_and_safe(name, encoded):
    assert encode_value(name) == encoded
    assert "/" not in encode_value(name) and encode_value(name) not in (".", "..")


def test_long_run_names_are_shortened_uniquely():
    a, b = encode_value("x" * 300 + "a"), encode_value("x" * 300 + "b")
    assert a != b and len(a) <= MAX_ENCODED and len(b) <= MAX_ENCODED
    for name in ("é" * 100, "x" + "🙂" * 60, "a/" * 150):
        short = encode_value(name)
        assert len(short) <= MAX_ENCODED and name.startswith(unquote(short.rsplit("~", 1)[0], errors="strict"))
    assert partition_path("2026-11-30", "r/1") == "date=2026-11-30/run=r%2F1"
    assert partition_path(None, "r") == "run=r"


def test_local_export_reads_back_in_duckdb_with_the_databases_counts(data: Path, tmp_path: Path):
    out = tmp_path / "out"
    proc = run_cli("export", "--format", "parquet", "--data", str(data), "--out", str(out))
    assert "wrote" in proc.stdout and proc.stderr == ""  # no progress line when stderr is not a terminal
    want = db_counts(data / "toolproxy.duckdb")
    assert want["exchanges"] > 400 and want["turns"] > 0 and want["calls"] > 0
    assert parquet_counts(str(out)) == want
    # the hive path's run decodes to the exact run name (names shortened for length aside)
    runs = {
        r[0]
        for r in duckdb.sql(
            f"SELECT DISTINCT run FROM read_parquet('{out}/exchanges/**/*.parquet', "
            "hive_partitioning=true, hive_types={'run': 'VARCHAR'})"
        ).fetchall()
    }
    con = duckdb.connect(str(data / "toolproxy.duckdb"), read_only=True)
    db_runs = {r[0] for r in con.execute("SELECT DISTINCT run FROM exchanges").fetchall()}
    con.close()
    assert set(HOSTILE) - {""} <= db_runs
    assert {as_hive(n) for n in db_runs} == runs
    exact = {
        r[0]
        for r in duckdb.sql(
            f"SELECT DISTINCT run FROM read_parquet('{out}/exchanges/**/*.parquet', hive_partitioning=false)"
        ).fetchall()
    }
    assert exact == db_runs
    # every file stayed inside the destination, under its table, in date=/run= folders
    for p in out.rglob("*.parquet"):
        rel = p.resolve().relative_to(out.resolve()).parts
        assert rel[0] in TABLES and len(rel) == (3 if rel[0] == "runs" else 4), rel
    # raw bodies are in the export as recorded (the database itself keeps no copy of them)
    recorded = {
        r["id"]: (r.get("request_body"), r.get("response_body"), r.get("response_body_encoding"))
        for r in read_records(data, kind="exchange")
    }
    exported = {
        r[0]: r[1:]
        for r in duckdb.sql(
            "SELECT id, request_body, response_body, response_body_encoding FROM "
            f"read_parquet('{out}/exchanges/**/*.parquet')"
        ).fetchall()
    }
    assert exported == recorded and any(v[1] for v in exported.values())
    meta = dict(
        duckdb.sql(
            f"SELECT key::VARCHAR, value::VARCHAR FROM parquet_kv_metadata('{out}/turns/**/*.parquet')"
        ).fetchall()
    )
    manifest = orjson.loads((out / "_toolproxy_export/manifest.json").read_bytes())
    assert meta["toolproxy.table"] == "turns"
    for key in ("schema_version", "analyzer_version", "export_format_version"):
        assert meta[f"toolproxy.{key}"] == str(manifest[key]) and manifest[key] >= 1
    assert not (out / "_toolproxy_export/pending.json").exists()
    assert not [p for p in (out / "_toolproxy_export").iterdir() if p.name.startswith("staging-")]


def test_second_export_writes_nothing(data: Path, tmp_path: Path):
    out = tmp_path / "out"
    run_cli("export", "--data", str(data), "--out", str(out))
    before = files_with_mtimes(out)
    proc = run_cli("export", "--data", str(data), "--out", str(out))
    assert "nothing new to export" in proc.stdout
    assert files_with_mtimes(out) == before


def test_new_traffic_adds_files_and_rederived_rows_rewrite_their_partitions(data: Path, tmp_path: Path):
    out = tmp_path / "out"
    run_cli("export", "--data", str(data), "--out", str(out))
    before = files_with_mtimes(out)
    t = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC).timestamp()
    write_segment(data, "20261128T120000-3-0001", [("a/b", t + i) for i in range(4)] + [("brand-new", t + 9)])
    analyze(data)
    proc = run_cli("export", "--data", str(data), "--out", str(out))
    assert "exchanges: partitions 1 new, 1 appended, 0 rewritten" in proc.stdout, proc.stdout
    after = files_with_mtimes(out)
    kept = {k: v for k, v in before.items() if k.startswith("exchanges/")}
    assert {k: after[k] for k in kept} == kept  # old exchange files untouched
    assert parquet_counts(str(out)) == db_counts(data / "toolproxy.duckdb")
    # a changed rule re-derives every turn's expectation: those partitions are rewritten, not duplicated
    analyze(data, "--expect", "category=*:none")
    proc = run_cli("export", "--data", str(data), "--out", str(out))
    assert "turns: partitions 0 new, 0 appended, 0 rewritten" not in proc.stdout
    assert "exchanges: partitions 0 new, 0 appended, 0 rewritten" in proc.stdout
    want = db_counts(data / "toolproxy.duckdb")
    assert parquet_counts(str(out)) == want
    con = duckdb.connect(str(data / "toolproxy.duckdb"), read_only=True)
    expect = sorted(con.execute("SELECT turn_id, expect FROM turns").fetchall())
    con.close()
    assert (
        sorted(duckdb.sql(f"SELECT turn_id, expect FROM read_parquet('{out}/turns/**/*.parquet')").fetchall()) == expect
    )
    manifest = orjson.loads((out / "_toolproxy_export/manifest.json").read_bytes())
    listed = {
        f"{table}/{part}/{f['name']}"
        for table, parts in manifest["tables"].items()
        for part, e in parts.items()
        for f in e["files"]
    }
    assert listed == {
        str(p.relative_to(out)) for p in out.rglob("*.parquet") if not str(p.relative_to(out)).startswith("_")
    }


KEYS = {
    "exchanges": "id",
    "calls": "exchange_id || ':' || idx",
    "turns": "turn_id",
    "episodes": "episode_key",
    "runs": "run",
}


def twice(out: Path) -> dict[str, list]:
    """Keys held by more than one exported row, per table."""
    return {
        t: duckdb.sql(
            f"SELECT {k} AS key, count(*) FROM read_parquet('{out}/{t}/**/*.parquet', hive_partitioning=false) "
            "GROUP BY key HAVING count(*) > 1"
        ).fetchall()
        for t, k in KEYS.items()
    }


def test_prune_then_export_never_holds_a_row_twice(tmp_path: Path):
    """Episodes that began on day 1 and went on on day 2 lose their day-1 turns to `prune`, so the
    analyzer re-derives them under day 2. The export writes them there; their old copies must leave
    the day-1 partition (which the database no longer has, and which the export keeps as history
    for the episodes wholly of day 1), or each would be in the export twice."""
    data = tmp_path / "data"
    seg = data / SEGMENT_DIR
    seg.mkdir(parents=True)
    day1 = dt.datetime(2026, 11, 20, 12, tzinfo=dt.UTC).timestamp()
    segments = {  # (episode, seconds after noon of day 1) per exchange of run r
        "20261120T120000-1-0001": [("cont0", 0), ("cont1", 1), ("cont2", 2), ("day1-only0", 10), ("day1-only1", 11)],
        "20261121T120000-1-0001": [("cont0", DAY), ("cont1", DAY + 1), ("cont2", DAY + 2), ("day2-only", DAY + 10)],
    }
    n = 0
    for name, rows in segments.items():
        with open(seg / f"{name}.jsonl", "wb") as f:
            for episode, dt_s in rows:
                f.write(_record("r", day1 + dt_s, n, text=None if n % 3 else "In prose.", episode=episode))
                n += 1
    analyze(data)
    out = tmp_path / "out"
    run_cli("export", "--data", str(data), "--out", str(out))
    exported_before = parquet_counts(str(out))
    assert exported_before == db_counts(data / "toolproxy.duckdb") and not any(twice(out).values())

    old = time.time() - 3 * DAY
    first = seg / "20261120T120000-1-0001.jsonl"
    os.utime(first, (old, old))
    proc = run_cli("prune", "--older-than", "1d", "--data", str(data))
    assert "deleted 1 segments" in proc.stdout and not first.exists()
    analyze(data)
    con = duckdb.connect(str(data / "toolproxy.duckdb"), read_only=True)
    episodes = sorted(con.execute("SELECT episode_key, n_turns FROM episodes").fetchall())
    con.close()
    assert episodes == [("r/cont0", 1), ("r/cont1", 1), ("r/cont2", 1), ("r/day2-only", 1)]

    proc = run_cli("export", "--data", str(data), "--out", str(out))
    assert twice(out) == dict.fromkeys(KEYS, [])
    assert (
        "episodes: partitions 0 new, 1 appended, 0 rewritten, 0 unchanged; 3 rows in 2 files; 3 old copies of rows "
        "that moved to another day removed from pruned partitions" in proc.stdout
    ), proc.stdout
    # each episode once, where the database puts it now; the day-1-only ones kept as history
    got = sorted(
        duckdb.sql(
            f"SELECT episode_key, n_turns, date::VARCHAR FROM read_parquet('{out}/episodes/**/*.parquet', "
            "hive_partitioning=true)"
        ).fetchall()
    )
    assert got == [
        ("r/cont0", 1, "2026-11-21"),
        ("r/cont1", 1, "2026-11-21"),
        ("r/cont2", 1, "2026-11-21"),
        ("r/day1-only0", 1, "2026-11-20"),
        ("r/day1-only1", 1, "2026-11-20"),
        ("r/day2-only", 1, "2026-11-21"),
    ]
    assert parquet_counts(str(out))["exchanges"] == exported_before["exchanges"] == 9  # pruned exchanges stay exported
    manifest = orjson.loads((out / "_toolproxy_export/manifest.json").read_bytes())
    listed = {
        f"{table}/{part}/{f['name']}"
        for table, parts in manifest["tables"].items()
        for part, e in parts.items()
        for f in e["files"]
    }
    assert listed == {
        str(p.relative_to(out)) for p in out.rglob("*.parquet") if not str(p.relative_to(out)).startswith("_")
    }
    keyfiles = {str(p.relative_to(out / "_toolproxy_export/keys"))[: -len(".keys")] for p in out.rglob("*.keys")}
    assert keyfiles == listed
    assert sum(e["rows"] for e in manifest["tables"]["episodes"].values()) == 6
    assert "nothing new to export" in run_cli("export", "--data", str(data), "--out", str(out)).stdout


def test_prune_then_export_to_an_object_store_never_holds_a_row_twice(tmp_path: Path):
    """The same through fsspec's in-memory filesystem: history files and key files come from the
    remote side, and the stale copies go there too."""
    data = tmp_path / "data"
    seg = data / SEGMENT_DIR
    seg.mkdir(parents=True)
    day1 = dt.datetime(2026, 11, 20, 12, tzinfo=dt.UTC).timestamp()
    first = seg / "20261120T120000-1-0001.jsonl"
    first.write_bytes(b"".join(_record("r", day1 + i, i, episode=e) for i, e in enumerate(["a", "b", "gone"])))
    (seg / "20261121T120000-1-0001.jsonl").write_bytes(
        b"".join(_record("r", day1 + DAY + i, 10 + i, episode=e) for i, e in enumerate(["a", "b"]))
    )
    analyze(data)
    url = f"memory://bucket-{os.getpid()}-{id(tmp_path)}/pruned"

    def export() -> dict:
        con = connect(data / "toolproxy.duckdb", read_only=True)
        try:
            return {t.name: t for t in parquet.export(con, Destination(url), data_dir=data).tables}
        finally:
            con.close()

    export()
    os.utime(first, (time.time() - 3 * DAY,) * 2)
    run_cli("prune", "--older-than", "1d", "--data", str(data))
    episodes = export()["episodes"]
    assert (episodes.new, episodes.rows, episodes.stale) == (1, 2, 2)
    reader = duckdb.connect()
    reader.register_filesystem(fsspec.filesystem("memory"))
    assert sorted(
        reader.sql(f"SELECT episode_key, date::VARCHAR FROM read_parquet('{url}/episodes/**/*.parquet')").fetchall()
    ) == [("r/a", "2026-11-21"), ("r/b", "2026-11-21"), ("r/gone", "2026-11-20")]
    assert reader.execute(f"SELECT count(*) FROM read_parquet('{url}/exchanges/**/*.parquet')").fetchone()[0] == 5
    assert all(t.files == 0 for t in export().values())


def test_memory_filesystem_and_a_second_machine_stay_consistent(data: Path, tmp_path: Path):
    """Another database analysed from the same recordings exports nothing new to the same URL."""
    url = f"memory://bucket-{os.getpid()}-{id(tmp_path)}/export"
    other = tmp_path / "other.duckdb"
    run_cli("analyze", "--data", str(data), "--db", str(other))
    for db in (data / "toolproxy.duckdb", other):
        con = connect(db, read_only=True)
        try:
            result = parquet.export(con, Destination(url), data_dir=data)
        finally:
            con.close()
    assert result.export_id is None and all(t.files == 0 for t in result.tables)
    fs = fsspec.filesystem("memory")
    reader = duckdb.connect()
    reader.register_filesystem(fs)
    assert parquet_counts(url, reader) == db_counts(data / "toolproxy.duckdb")
    # new traffic in an exported partition: its keys come back from the remote key files, one file is added
    t = dt.datetime(2026, 11, 29, 12, tzinfo=dt.UTC).timestamp()
    write_segment(data, "20261129T120000-4-0001", [("..", t + i) for i in range(3)])
    analyze(data)
    con = connect(data / "toolproxy.duckdb", read_only=True)
    try:
        result = parquet.export(con, Destination(url), data_dir=data)
    finally:
        con.close()
    exchanges = next(t for t in result.tables if t.name == "exchanges")
    assert (exchanges.new, exchanges.appended, exchanges.rewritten, exchanges.rows) == (0, 1, 0, 3)
    assert parquet_counts(url, reader) == db_counts(data / "toolproxy.duckdb")


@contextlib.contextmanager
def killed_in(monkeypatch, method: str, when):
    """Inside, an export dies (KeyboardInterrupt) at the first call of Destination.`method` whose
    arguments `when` accepts; the block must raise it."""
    real = getattr(Destination, method)

    def crash(self, *args):
        if when(*args):
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(Destination, method, crash)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        monkeypatch.setattr(Destination, method, real)


def killed_at_the_manifest(monkeypatch):
    """An export killed as it writes its manifest, so its files land and the manifest does not."""
    return killed_in(monkeypatch, "write_bytes", lambda rel, payload: rel == parquet.MANIFEST)


def age_journal(out: Path) -> dict:
    """Make the export journal at `out` older than STALE_SECONDS, as a dead export's would be; returns it as it was."""
    journal = orjson.loads((out / parquet.PENDING).read_bytes())
    (out / parquet.PENDING).write_bytes(
        orjson.dumps(journal | {"started_at": journal["started_at"] - 2 * parquet.STALE_SECONDS})
    )
    return journal


def test_an_interrupted_export_is_undone_by_the_next(data: Path, tmp_path: Path, monkeypatch):
    out = tmp_path / "out"
    con = connect(data / "toolproxy.duckdb", read_only=True)
    with killed_at_the_manifest(monkeypatch):
        parquet.export(con, Destination(str(out)), data_dir=data)
    assert list(out.glob("exchanges/**/*.parquet"))  # data files landed, the manifest did not
    with pytest.raises(ExportError, match="another export .* is in progress"):
        parquet.export(
            con, Destination(str(out)), data_dir=data
        )  # the journal is fresh and its process (this one) alive
    journal = age_journal(out)
    killed = out / parquet.STATE_DIR / "staging-killed"  # what a SIGKILLed export leaves behind
    (killed / "exchanges").mkdir(parents=True)
    old = journal["started_at"] - 2 * parquet.STALE_SECONDS
    os.utime(killed, (old, old))
    result = parquet.export(con, Destination(str(out)), data_dir=data)
    con.close()
    assert result.recovered and result.recovered.startswith("undid")
    assert not killed.exists()
    assert parquet_counts(str(out)) == db_counts(data / "toolproxy.duckdb")


def _caught_staging(data: Path, out: Path) -> tuple[subprocess.Popen, Path]:
    """An export (`toolproxy export` as a child process) stopped (SIGSTOP) while it stages: its
    staging folder holds its lock and what it staged. Retried until one is caught so."""
    import signal

    state = out / parquet.STATE_DIR
    for _ in range(20):
        before = set(state.glob(f"{parquet.STAGING}*")) if state.is_dir() else set()
        proc = subprocess.Popen(
            [*CLI, "export", "--data", str(data), "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while proc.poll() is None:
            staged = [p for p in state.glob(f"{parquet.STAGING}*") if p not in before] if state.is_dir() else []
            if staged and len(list(staged[0].iterdir())) > 1:
                proc.send_signal(signal.SIGSTOP)
                if staged[0].is_dir():
                    return proc, staged[0]
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.002)
        proc.wait()
    pytest.fail("no export was caught while it staged")


def test_a_killed_exports_staging_is_removed_by_the_next_however_young(data: Path, tmp_path: Path):
    """An export killed while it stages leaves its staging folder, bodies and all; the next export
    removes it, as this manual says, not an hour later. A live export's is left alone."""
    import signal

    out = tmp_path / "out"
    proc, staging = _caught_staging(data, out)
    try:
        run_cli("export", "--data", str(data), "--out", str(out))
        assert staging.is_dir()  # its export is alive (stopped): its folder stays
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert staging.is_dir()  # what a SIGKILLed export leaves behind
    run_cli("export", "--data", str(data), "--out", str(out))
    assert not staging.exists() and not list((out / parquet.STATE_DIR).glob(f"{parquet.STAGING}*"))


def test_filters_export_only_the_chosen_runs_and_days(data: Path, tmp_path: Path):
    out = tmp_path / "out"
    run_cli("export", "--data", str(data), "--out", str(out), "--run", "a/b", "--run", "..", "--since", "2026-11-29")
    got = duckdb.sql(
        f"SELECT DISTINCT run, date::VARCHAR FROM read_parquet('{out}/exchanges/**/*.parquet', hive_partitioning=true)"
    ).fetchall()
    assert got and {r for r, _ in got} == {"a/b", ".."} and all(d >= "2026-11-29" for _, d in got)


# The CLI in a Python where s3fs cannot be imported, as on an install without the [s3] extra.
WITHOUT_S3FS = [sys.executable, "-c", "import sys; sys.modules['s3fs'] = None; from toolproxy.cli import main; main()"]


@pytest.mark.parametrize(
    "cli, out, message",
    [
        (CLI, "zz://bucket/x", "unknown scheme 'zz'"),
        (WITHOUT_S3FS, "s3://toolproxy-test-bucket/x", "pip install 'toolproxy-recorder[s3]'"),
    ],
)
def test_bad_destinations_are_one_clear_line(data: Path, cli: list[str], out: str, message: str):
    proc = subprocess.run(
        [*cli, "export", "--data", str(data), "--out", out], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_file_as_destination_and_a_bad_since_are_refused(data: Path, tmp_path: Path):
    f = tmp_path / "file"
    f.write_text("x")
    proc = run_cli("export", "--data", str(data), "--out", str(f), check=False)
    assert proc.returncode == 2 and "is a file" in proc.stderr
    proc = run_cli("export", "--data", str(data), "--out", str(tmp_path / "o"), "--since", "yesterday", check=False)
    assert proc.returncode == 2 and "--since" in proc.stderr
    proc = run_cli("export", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), check=False)
    assert proc.returncode == 2 and "no data directory at" in proc.stderr


@pytest.fixture(scope="module")
def s3_server():
    """moto's standalone S3 server on 127.0.0.1: a real S3 wire protocol that s3fs talks to."""
    pytest.importorskip("s3fs")
    server = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    if server is None:
        pytest.skip("moto[server] is not installed")
    port = _free_port()
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _s3_env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return (
        env
        | {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }
        | extra
    )


@pytest.mark.s3
def test_s3_export_through_a_real_s3_server(data: Path, tmp_path: Path, s3_server: str):
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": s3_server})
    fs.mkdir("exports")
    args = [*CLI, "export", "--data", str(data), "--out", "s3://exports/toolproxy"]
    first = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_s3_env(s3_server))
    assert first.returncode == 0 and "wrote" in first.stdout, first.stderr
    second = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_s3_env(s3_server))
    assert second.returncode == 0 and "nothing new to export" in second.stdout, second.stderr
    fs.invalidate_cache()
    fs.get("exports/toolproxy", str(tmp_path / "copy"), recursive=True)
    assert parquet_counts(str(tmp_path / "copy")) == db_counts(data / "toolproxy.duckdb")
    env = _s3_env(s3_server)
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    for out, out_env, message in [
        ("s3://exports/again", env, "no credentials found"),
        ("s3://no-such-bucket/x", _s3_env(s3_server), "bucket 'no-such-bucket' does not exist"),
    ]:
        proc = subprocess.run(
            [*CLI, "export", "--data", str(data), "--out", out],
            capture_output=True,
            text=True,
            timeout=120,
            env=out_env,
        )
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_progress_line_on_a_terminal(data: Path, tmp_path: Path):
    rc, _, shown = on_a_terminal([*CLI, "export", "--data", str(data), "--out", str(tmp_path / "out")], timeout=300)
    assert rc == 0
    assert REDRAW + b"export: writing to" in shown and b"MB" in shown and b"Traceback" not in shown, shown


def test_a_database_analysed_by_another_analyzer_version_is_refused(data: Path, tmp_path: Path):
    db = data / "toolproxy.duckdb"
    con = duckdb.connect(str(db))
    con.execute("UPDATE analyzer_state SET value = '1' WHERE key = 'analyzer_version'")
    con.close()
    proc = run_cli("export", "--data", str(data), "--out", str(tmp_path / "out"), check=False)
    assert proc.returncode == 2 and "analyzer version 1" in proc.stderr and "toolproxy analyze" in proc.stderr, (
        proc.stderr
    )
    assert not (tmp_path / "out").exists()
