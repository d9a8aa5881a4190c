"""Benchmark: a realistic synthetic data dir, then a timed `analyze` over it.

    python -m benchmarks.analyzer --exchanges 100000 [--mix agents|small|long|untagged|daily] [--rounds 3] [--more 1000]
                                       [--floor] [--commands] [--python OTHER_VENV/bin/python ...] [--dir DIR] [--keep]

The `agents` data dir (the default) has what real recordings have: multi-turn agent episodes
whose message lists grow turn by turn, a ~2 KB tools array resent every turn, several stacks with
their own wire shapes (Ollama /v1 and native NDJSON, vLLM SSE fragments and its default 400,
SGLang calls in text, llama.cpp timings), streams and non-streams, retries after 500s, timeouts,
hallucinated names, invalid arguments, prose, and one untagged run that needs prefix-chaining
reconstruction. The `small` mix is single requests with short bodies (one small tool or none),
the shape of a chat front end's traffic. The `long` mix is production agent traffic: tagged
episodes of 20-50 turns in one run, records of 4-12 KB (a system prompt, task and tools of a few KB
resent every turn with the history); the `untagged` mix is the same traffic with no tags at all, one
run whose episodes analyze reconstructs by chaining; the `daily` mix is that untagged traffic over 30
days, a run per day as `serve --run prod-%Y-%m-%d` records it. Records are the proxy's own Record dataclass serialised
exactly as the segment writer does.

`toolproxy analyze` runs as a subprocess, exactly as a user runs it, into a fresh database each
round; reported per round and as medians: exchanges/s (wall, process start and DuckDB's final
checkpoint included), CPU per exchange over all its processes, its peak RSS (its own, read by
toolproxy.testing.peak: wait4's would carry over this process's, which holds the corpus) and the
database size. Each --python (another interpreter with another toolproxy installed, e.g. a venv of the
main branch) analyses the same data in the same rounds, interleaved, and the ratios to this one
are printed: on a shared, noisy machine only side-by-side numbers compare.

Each interpreter's toolproxy is byte-compiled first (as pip leaves an installed one), so that no
process pays for compiling sources.

`--more N` holds the last N records back from the data dir and, after each fresh analyze, adds
them as a new segment and times the re-analyze: what a periodic `analyze` costs as data arrives.
`--floor` also times DuckDB's own `read_json` loading the same segments into a table (parsing
only, no classification): the floor analyze's CPU per exchange is compared with. `--commands` then
times what users run on the analysed store, each as its own process under the same --memory-limit:
`report`, `compare` of the two runs sharing the most items, and a first `export` in each Parquet layout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolproxy.analysis.store.connection import default_db
from toolproxy.record.writer import SEGMENT_DIR
from toolproxy.testing import peak
from toolproxy.testing.corpus import generate, generate_daily, generate_long, generate_small, generate_untagged

GENERATORS = {
    "agents": generate,
    "small": generate_small,
    "long": generate_long,
    "untagged": generate_untagged,
    "daily": generate_daily,
}


def _analyze(
    python: str, data_dir: Path, args: argparse.Namespace, fresh: bool = True
) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MB, output) of `toolproxy analyze` as a user runs it, into a fresh
    database unless not `fresh`."""
    db = default_db(data_dir)
    for stale in (db, db.with_name(db.name + ".wal")) if fresh else ():
        stale.unlink(missing_ok=True)
    args_ = ["analyze", "--data", str(data_dir), "--batch-mb", str(args.batch_mb), "--quiet"]
    if args.workers is not None:
        args_ += ["--workers", str(args.workers)]
    return _cli(python, data_dir, args.memory_limit, *args_)


def _cli(python: str, data_dir: Path, memory_limit: str, *args: str) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MB, output) of one toolproxy command, waited for by itself so the
    CPU and peak RSS are its own, its workers included (peak RSS read by toolproxy.testing.peak:
    wait4's would carry over this process's, which holds the corpus). It runs in the data dir so
    that a checkout in the current directory cannot shadow the toolproxy that `python` has installed."""
    out_file = Path(tempfile.gettempdir()) / f"toolproxy-bench-peak-{os.getpid()}"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        peak.command(python, out_file, *args, "--memory-limit", memory_limit),
        cwd=data_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out = proc.stdout.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"`toolproxy {args[0]}` with {python} failed ({proc.returncode}):\n{out}")
    rss = peak.read_mb(out_file)
    out_file.unlink()
    return dt, usage.ru_utime + usage.ru_stime, rss, out


_PAIRED_RUNS = """
WITH items AS (SELECT DISTINCT run, item_key FROM episodes WHERE item_key IS NOT NULL)
SELECT a.run, b.run FROM items a JOIN items b ON a.item_key = b.item_key AND a.run < b.run
GROUP BY ALL ORDER BY count(*) DESC, 1, 2 LIMIT 1
"""


def _commands(python: str, data_dir: Path, memory_limit: str) -> list[tuple[str, float, float, float]]:
    """(command, wall s, CPU s, peak RSS MB) of what a user runs on an analysed store: the report,
    a paired comparison of the two runs sharing the most items (when two do), and a first Parquet
    export into an empty directory in each layout."""
    import duckdb

    with duckdb.connect(str(default_db(data_dir)), read_only=True) as con:
        paired = con.execute(_PAIRED_RUNS).fetchone()
    out = data_dir / "bench-out"
    steps = [("report", ["report", "--data", str(data_dir), "--format", "json", "-o", str(out / "report.json")])]
    if paired:
        steps.append(
            (
                f"compare {paired[0]} {paired[1]}",
                ["compare", *paired, "--data", str(data_dir), "--format", "json", "-o", str(out / "compare.json")],
            )
        )
    steps += [
        (
            f"export --layout {layout}",
            ["export", "--data", str(data_dir), "--out", str(out / layout), "--layout", layout, "--quiet"],
        )
        for layout in ("whole", "pieces")
    ]
    rows = []
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    try:
        for name, cmd in steps:
            dt, cpu, rss, _ = _cli(python, data_dir, memory_limit, *cmd)
            rows.append((name, dt, cpu, rss))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return rows


_COMPILE = """
import compileall, toolproxy, toolproxy.analysis
ok = all(compileall.compile_dir(path, quiet=1) for m in (toolproxy, toolproxy.analysis) for path in m.__path__)
raise SystemExit(0 if ok else 1)
"""


def _byte_compiled(python: str) -> None:
    """Byte-compile the toolproxy that `python` imports, as pip leaves an installed one. An editable
    checkout where bytecode is never written (PYTHONDONTWRITEBYTECODE, a read-only tree) would
    compile its sources again in every process, the workers' too: ~0.3 s each, which at 10,000
    exchanges made one of two equal analyzers look 25% slower."""
    if subprocess.run([python, "-c", _COMPILE], cwd=tempfile.gettempdir()).returncode != 0:
        raise SystemExit(f"could not byte-compile the toolproxy of {python}")


def _hold_back(data_dir: Path, n: int) -> bytes:
    """The last n record lines of the data dir's last segment, cut off it."""
    last = sorted((data_dir / SEGMENT_DIR).iterdir())[-1]
    lines = last.read_bytes().splitlines(keepends=True)
    if n > len(lines):
        raise SystemExit(f"--more {n}: the last segment has only {len(lines)} records")
    last.write_bytes(b"".join(lines[:-n]))
    return b"".join(lines[-n:])


_FLOOR = """
import sys, duckdb
con = duckdb.connect(sys.argv[2])
con.execute("SET memory_limit = '1GB'")
con.execute("SET enable_progress_bar = false")
con.execute("CREATE TABLE records AS SELECT * FROM read_json(?, format = 'newline_delimited')", [sys.argv[1]])
print(con.execute("SELECT count(*) FROM records").fetchone()[0], len(con.execute("DESCRIBE records").fetchall()))
with open("/proc/self/status") as f:  # its own peak, as toolproxy.testing.peak reads analyze's
    print(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")))
"""


def _floor(data_dir: Path) -> tuple[float, float, float, list[str]]:
    """(wall s, CPU s, peak RSS MB, [rows, columns]) of DuckDB's read_json loading the segments into a table."""
    db = data_dir / "floor.duckdb"
    db.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _FLOOR, str(data_dir / SEGMENT_DIR / "*.jsonl"), str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out = proc.stdout.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    db.unlink(missing_ok=True)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"read_json floor failed:\n{out}")
    *_, rows, columns, hwm_kb = out.split()
    return dt, usage.ru_utime + usage.ru_stime, int(hwm_kb) / 1024, [rows, columns]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exchanges", type=int, default=100_000)
    ap.add_argument("--mix", choices=sorted(GENERATORS), default="agents", help="which data dir to generate")
    ap.add_argument(
        "--more",
        type=int,
        default=0,
        metavar="N",
        help="hold the last N records back; after each fresh analyze, add them and time the re-analyze",
    )
    ap.add_argument("--floor", action="store_true", help="also time DuckDB's read_json loading the same segments")
    ap.add_argument("--rounds", type=int, default=1, help="analyses of the same data, each into a fresh database")
    ap.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PYTHON",
        help="another interpreter (with its own toolproxy) to run side by side, interleaved (repeatable)",
    )
    ap.add_argument("--dir", type=Path, default=None, help="data dir to create (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the data dir and database afterwards")
    ap.add_argument("--batch-mb", type=float, default=8.0)
    ap.add_argument("--memory-limit", default="1GB", help="DuckDB memory limit, as for analyze")
    ap.add_argument("--workers", type=int, default=None, help="analysis processes (default: by data size)")
    ap.add_argument(
        "--commands",
        action="store_true",
        help="after the analyses, also time report, compare and export (both layouts) on the store",
    )
    args = ap.parse_args(argv)

    data_dir = (args.dir or Path(tempfile.mkdtemp(prefix="toolproxy-bench-"))).resolve()
    pythons = [sys.executable, *args.python]
    for python in pythons:
        _byte_compiled(python)
    try:
        t0 = time.perf_counter()
        n = GENERATORS[args.mix](data_dir, args.exchanges)
        held = _hold_back(data_dir, args.more) if args.more else b""
        n -= args.more
        size = sum(p.stat().st_size for p in (data_dir / SEGMENT_DIR).iterdir())
        print(
            f"generated {n} exchanges, mix {args.mix} ({size / 1e6:.0f} MB of segments) in "
            f"{time.perf_counter() - t0:.1f}s: {data_dir}"
        )
        results: dict[str, list[tuple[float, float, float]]] = {p: [] for p in pythons}
        more = data_dir / SEGMENT_DIR / "20991231T235959-1-0001.jsonl"
        for r in range(args.rounds):
            for python in pythons:
                more.unlink(missing_ok=True)
                dt, cpu, rss, out = _analyze(python, data_dir, args)
                results[python].append((n / dt, cpu / n * 1e6, rss))
                if r == 0 and python == pythons[0]:
                    print(out.rstrip())
                print(
                    f"round {r + 1} {python}: {n / dt:,.0f} exchanges/s wall ({dt:.1f}s, process start and final "
                    f"checkpoint included); {cpu / n * 1e6:.0f} us CPU per exchange; peak RSS {rss:.0f} MB; "
                    f"db {default_db(data_dir).stat().st_size / 1e6:.0f} MB"
                )
                if held:
                    more.write_bytes(held)
                    dt2, cpu2, rss2, out2 = _analyze(python, data_dir, args, fresh=False)
                    part = next((f"; {line}" for line in out2.splitlines() if line.startswith("derived in part")), "")
                    print(
                        f"  +{args.more} records, re-analyze {python}: {dt2:.2f}s wall, {cpu2:.2f}s CPU "
                        f"({cpu2 / cpu:.3f} of the fresh analyze's), peak RSS {rss2:.0f} MB{part}"
                    )
            if args.floor:
                more.unlink(missing_ok=True)
                fdt, fcpu, frss, (rows, columns) = _floor(data_dir)
                cpu = results[pythons[0]][-1][1] * n / 1e6
                print(
                    f"round {r + 1} floor: DuckDB read_json into a table ({rows} rows, {columns} columns): {fdt:.1f}s "
                    "wall, "
                    f"{fcpu / n * 1e6:.0f} us CPU per exchange, peak RSS {frss:.0f} MB; {pythons[0]} analyze "
                    f"{cpu / fcpu:.1f}x its CPU"
                )
        base = statistics.median(x[0] for x in results[pythons[0]])
        for python in pythons:
            rate, cpu, rss = (statistics.median(x[i] for x in results[python]) for i in range(3))
            print(
                f"=> median of {args.rounds}, {python}: {rate:,.0f} exchanges/s wall, {cpu:.0f} us CPU per exchange, "
                f"peak RSS {rss:.0f} MB" + (f"; {rate / base:.2f}x this one's rate" if python != pythons[0] else "")
            )
        if held:
            more.write_bytes(held)  # the database holds them
        dt2, _, _, out2 = _analyze(pythons[0], data_dir, args, fresh=False)
        print(f"re-run: {out2.splitlines()[0]} ({dt2:.1f}s)")
        for python in pythons if args.commands else ():
            if python != pythons[0]:
                _analyze(python, data_dir, args)  # its own store, as its own analyzer wrote it
            rows = _commands(python, data_dir, args.memory_limit)
            for name, dt, cpu, rss in rows:
                print(f"{name} {python}: {dt:.2f}s wall, {cpu:.2f}s CPU, peak RSS {rss:.0f} MB")
            if not any(name.startswith("compare") for name, *_ in rows):
                print(f"compare {python}: not timed, no two runs share an item")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
