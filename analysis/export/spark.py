"""The analyzer on Apache Spark: the same ingest, classification and run metrics as `analyze`,
for recordings too large for one machine.

    spark-submit deploy/spark/analyze.py --data /shared/toolproxy-data --out /shared/analysis
    python -m toolproxy.analysis.export.spark --data DIR --out OUT [--master 'local[*]']

Nothing here re-implements the analyzer: Spark only moves data between toolproxy's own functions.

1. Read and classify, in parallel over byte ranges of the segments (`mapInArrow`). Each task
   calls `load.lines.analyze_range`, the function `analyze`'s worker processes call, so every
   record is parsed, reassembled and classified exactly as there. Raw bodies and headers stay in the
   segments (each row keeps its segment and offset): what travels on are the analysed columns.
2. Group by run (`applyInArrow`). Episodes, turns, roles, run rows and metrics never look
   outside their run, with two exceptions that are brought into the group: fingerprints (a
   stack identifies itself once per upstream, for every run using it; they are few and go to
   every group) and Responses requests chained by `previous_response_id` to a stored response
   recorded under another run (that exchange is joined into the chaining run's group). Each
   group loads its rows into an in-memory DuckDB with the analyzer's own schema and runs the
   analyzer's own SQL and Python on it: `link_stored_responses`, `derive`, `summarize`.
3. The driver writes each table as Parquet under --out and prints the report (any format
   `toolproxy report` has), built by the same renderers from the per-run summaries.

A record seen twice (a segment copied into the data dir twice) counts once, the first copy in
segment order winning, as in `analyze`. Unlike `analyze`, the job is not incremental: it reads
every segment each time and replaces its output.

Segments are read by path, so on a cluster the data directory must be mounted at the same path
on the driver and every executor (the shared volume the proxies write to), and toolproxy with
this extra must be installed on them (`pip install 'toolproxy-recorder[spark]'`).
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.analysis.load.lines import CALL_TYPES, EXCHANGE_TYPES, analyze_range
from toolproxy.analysis.load.pipeline import after_last_newline, link_stored_responses, next_line_end
from toolproxy.analysis.store.connection import insert_columns, migrate
from toolproxy.analysis.store.tables import FINGERPRINTS
from toolproxy.record.segments import list_segments
from toolproxy.term.printable import printable

# Bytes of segment per read task: small enough that a 2-core machine gets several tasks per
# segment, large enough that per-task overhead stays small.
RANGE_BYTES = 32 << 20
# The bodies are never copied out of the segments, and the headers and rewritten request are big
# and read by nothing after classification: they stay there too (segment + segment_offset).
_LEFT_IN_SEGMENT = ("upstream_request", "request_headers", "response_headers")
_ID = list(EXCHANGE_TYPES).index("id")

# Stage 1's rows: one per exchange, call, fingerprint or set-aside line; the payload is the row
# ingest builds for that table as a JSON list in the table's column order (lossless for its plain
# values, and the column names not repeated on every row).
PARSED_SCHEMA = (
    "grp string, kind string, segment string, offset long, response_id string, "
    "previous_response_id string, payload binary"
)
# Stage 2's rows: one per run and output table, the table's rows for that run as Arrow IPC.
DERIVED_SCHEMA = "tbl string, run string, data binary"
# The tables written under --out (the analyzer's own, one run at a time), and the per-run report row.
TABLES = ("exchanges", "calls", "turns", "episodes", "runs")
SUMMARY = "summary"


def split_segments(data_dir: str | Path, range_bytes: int = RANGE_BYTES) -> list[tuple[str, int, int]]:
    """(path, start, end) byte ranges covering every segment; a task snaps its range to lines."""
    out = []
    for path in list_segments(data_dir):
        size = path.stat().st_size
        out += [(str(path), a, min(a + range_bytes, size)) for a in range(0, size, range_bytes)]
    return out


def line_range(path: str, start: int, end: int) -> tuple[int, int, bool]:
    """The whole lines that start in [start, end) of a segment, and whether the segment's torn
    last line (being written, or cut by a crash; left out) falls in this range."""
    with open(path, "rb") as f:
        size = f.seek(0, io.SEEK_END)
        complete = after_last_newline(f, 0, size)
        first = 0 if start == 0 else next_line_end(f, min(start - 1, complete), complete)
        last = complete if end >= size else next_line_end(f, min(end - 1, complete), complete)
    return first, max(first, last), end >= size > complete


def parse_range(path: str, start: int, end: int) -> dict[str, list]:
    """Stage 1 for one range: ingest's own analysis, as PARSED_SCHEMA columns."""
    first, last, torn = line_range(path, start, end)
    cols: dict[str, list] = {
        k: [] for k in ("grp", "kind", "segment", "offset", "response_id", "previous_response_id", "payload")
    }

    def add(grp, kind, segment, offset, payload, response_id=None, previous=None):
        for k, v in zip(cols, (grp, kind, segment, offset, response_id, previous, orjson.dumps(payload))):
            cols[k].append(v)

    if torn:
        add(None, "issue", Path(path).name, last, ["torn_tail", "incomplete last line"])
    if last <= first:
        return cols
    batch = analyze_range(path, first, last)
    columns = batch.exchange_columns
    run_of = {}
    for i, run in enumerate(columns.get("run", ())):
        run_of[columns["id"][i]] = run
        meta = orjson.loads(columns["record"][i]) if columns["record"][i] else {}
        add(
            run,
            "exchange",
            columns["segment"][i],
            columns["segment_offset"][i],
            [None if name in _LEFT_IN_SEGMENT else columns[name][i] for name in EXCHANGE_TYPES],
            meta.get("response_id"),
            meta.get("previous_response_id"),
        )
    for call in batch.calls:
        add(run_of.get(call["exchange_id"]), "call", batch.segment, None, [call[name] for name in CALL_TYPES])
    for fp in batch.fingerprints:
        add(None, "fingerprint", batch.segment, fp["segment_offset"], fp)
    for issue in batch.issues:
        add(None, "issue", issue["segment"], issue["byte_offset"], [issue["kind"], issue["message"]])
    return cols


def _parse_batches(batches):
    import pyarrow as pa

    for b in batches:
        for path, start, end in zip(*(b.column(i).to_pylist() for i in range(3))):
            cols = parse_range(path, start, end)
            if cols["kind"]:
                yield pa.RecordBatch.from_pydict(cols, schema=_arrow_parsed())


def _arrow_parsed():
    import pyarrow as pa

    return pa.schema(
        [
            ("grp", pa.string()),
            ("kind", pa.string()),
            ("segment", pa.string()),
            ("offset", pa.int64()),
            ("response_id", pa.string()),
            ("previous_response_id", pa.string()),
            ("payload", pa.binary()),
        ]
    )


def _select(con, table: str) -> str:
    """SELECT of a table's columns for output: JSON as text, the bodies left in the segments."""
    cols = []
    for name, sql_type, *_ in con.execute(f"DESCRIBE {table}").fetchall():
        if table == "exchanges" and name in _LEFT_IN_SEGMENT:
            continue
        cols.append(f'"{name}"::VARCHAR AS "{name}"' if sql_type == "JSON" else f'"{name}"')
    return f"SELECT {', '.join(cols)} FROM {table}"


def _run_filter(table: str) -> str:
    if table == "calls":
        return " WHERE exchange_id IN (SELECT id FROM exchanges WHERE run = $run) ORDER BY exchange_id, idx"
    order = {
        "exchanges": "started_at, id",
        "turns": "episode_key, turn_index",
        "episodes": "episode_key",
        "runs": "run",
    }[table]
    return f" WHERE run = $run ORDER BY {order}"


def empty_database():
    """An in-memory DuckDB with the analyzer's schema, one thread (Spark runs the tasks in parallel)."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads=1")
    migrate(con)
    return con


def derive_run(
    run: str,
    rows: Sequence[tuple[str, bytes]],
    fingerprints: Sequence[list],
    *,
    rules=(),
    seed: int = 0,
    resamples: int | None = None,
    source: str = "",
) -> dict[str, object]:
    """Stage 2 for one run: its rows (kind, payload) in segment order, through the analyzer's own
    derivation and summary. Returns each output table's rows as an Arrow table, and the summary."""
    from toolproxy.analysis.episodes.derive import derive
    from toolproxy.analysis.measure import stats
    from toolproxy.analysis.measure.summary import summarize

    con = empty_database()
    exchanges, calls, seen = [], {}, set()
    for kind, payload in rows:
        row = orjson.loads(payload)
        if kind == "call":
            calls.setdefault((row[0], row[1]), row)  # a copied segment repeats them
        elif row[_ID] not in seen:
            seen.add(row[_ID])
            exchanges.append(row)
    calls = [c for c in calls.values() if c[0] in seen]
    insert_columns(con, "exchanges", _columns(exchanges, EXCHANGE_TYPES), EXCHANGE_TYPES)
    insert_columns(con, "calls", _columns(calls, CALL_TYPES), CALL_TYPES)
    FINGERPRINTS.insert(con, FINGERPRINTS.columns_of(fingerprints), on_conflict="ON CONFLICT DO NOTHING")
    link_stored_responses(con, {run})
    derive(con, {run}, list(rules))
    out: dict[str, object] = {t: _arrow(con, _select(con, t) + _run_filter(t), {"run": run}) for t in TABLES}
    out[SUMMARY] = summarize(con, [run], source, seed=seed, resamples=resamples or stats.RESAMPLES, rules=()).runs[0]
    con.close()
    return out


def _arrow(con, query: str, params: dict | None = None):
    """A query's result as an Arrow table (DuckDB 1.4 renamed `arrow` to `to_arrow_table`)."""
    rel = con.sql(query, params=params)
    fetch = getattr(rel, "to_arrow_table", None) or rel.arrow
    return fetch()


def _columns(rows: list, types: dict[str, str]) -> dict[str, list]:
    return {name: [r[i] for r in rows] for i, name in enumerate(types)}


def _derive_group(fingerprints, rules, seed, resamples):
    def apply(table):
        import pyarrow as pa

        run = table.column("grp")[0].as_py()
        kinds, segments, offsets, payloads = (
            table.column(c).to_pylist() for c in ("kind", "segment", "offset", "payload")
        )
        # Exchanges in segment order (the first copy of a record wins, as in `analyze`), then calls.
        order = sorted(range(table.num_rows), key=lambda i: (kinds[i] == "call", segments[i] or "", offsets[i] or 0))
        rows = [("call" if kinds[i] == "call" else "exchange", payloads[i]) for i in order]
        result = derive_run(run, rows, fingerprints, rules=rules, seed=seed, resamples=resamples)
        out = {"tbl": [], "run": [], "data": []}
        for name, value in result.items():
            if name == SUMMARY:
                data = pickle.dumps(value)
            else:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, value.schema) as writer:
                    writer.write_table(value)
                data = sink.getvalue().to_pybytes()
            out["tbl"].append(name)
            out["run"].append(run)
            out["data"].append(data)
        return pa.table(out, schema=pa.schema([("tbl", pa.string()), ("run", pa.string()), ("data", pa.binary())]))

    return apply


def _unpack(batches):
    import pyarrow as pa

    for b in batches:
        for data in b.column("data").to_pylist():
            yield from pa.ipc.open_stream(data).read_all().to_batches()


def output_schemas() -> dict[str, object]:
    """Each output table's Spark schema, from the analyzer's own schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    con = empty_database()
    try:
        return {t: from_arrow_schema(_arrow(con, _select(con, t) + " LIMIT 0").schema) for t in TABLES}
    finally:
        con.close()


def session(master: str | None, app_name: str = "toolproxy-analyze"):
    """A SparkSession; with a local master the workers run this very interpreter (and toolproxy)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
        if master.startswith("local"):
            # Room for a large run's rows in the one JVM (Spark's default is 1 GB).
            builder = (
                builder.config("spark.pyspark.python", sys.executable)
                .config("spark.ui.enabled", "false")
                .config("spark.driver.memory", os.environ.get("TOOLPROXY_SPARK_MEMORY", "4g"))
            )
    return builder.getOrCreate()


def run_job(
    spark,
    data_dir: str | Path,
    out_dir: str | Path | None,
    *,
    rules=(),
    seed: int = 0,
    resamples: int | None = None,
    range_bytes: int = RANGE_BYTES,
    partitions: int | None = None,
):
    """Analyse data_dir on `spark`; write the tables under out_dir (if given); return
    (Report, counts) where counts says what was read and set aside.

    partitions: groups of runs analysed in parallel (default: the cluster's cores). Set here, not
    left to Spark's 200 shuffle partitions: the cached stages keep their partitioning, so
    adaptive execution never merges the near-empty ones, and each costs a Python task.
    """
    import pyarrow as pa
    from pyspark.sql import functions as F

    from toolproxy.analysis.measure.summary import Report

    data_dir = Path(data_dir)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions or spark.sparkContext.defaultParallelism))
    ranges = split_segments(data_dir, range_bytes)
    if not ranges:
        raise JobError(f"no segments under {data_dir}: is this the data directory the proxy records into?")
    source = spark.createDataFrame(ranges, "path string, start long, end long").repartition(len(ranges))
    parsed = source.mapInArrow(_parse_batches, PARSED_SCHEMA).persist()

    side = parsed.filter(F.col("kind").isin("fingerprint", "issue")).select("kind", "payload").collect()
    fingerprints = [orjson.loads(r.payload) for r in side if r.kind == "fingerprint"]
    issues: dict[str, int] = {}
    for r in side:
        if r.kind == "issue":
            kind = orjson.loads(r.payload)[0]
            issues[kind] = issues.get(kind, 0) + 1

    rows = parsed.filter(F.col("kind").isin("exchange", "call"))
    refs = (
        rows.filter(F.col("previous_response_id").isNotNull())
        .select(F.col("grp").alias("ref_grp"), F.col("previous_response_id").alias("ref_id"))
        .distinct()
    )
    targets = rows.filter(F.col("response_id").isNotNull())
    foreign = (
        targets.join(refs, targets.response_id == refs.ref_id)
        .filter(targets.grp != refs.ref_grp)
        .select(
            F.col("ref_grp").alias("grp"),
            F.lit("foreign").alias("kind"),
            "segment",
            "offset",
            "response_id",
            "previous_response_id",
            "payload",
        )
    )
    derived = (
        rows.unionByName(foreign)
        .groupBy("grp")
        .applyInArrow(_derive_group(fingerprints, list(rules), seed, resamples), DERIVED_SCHEMA)
        .persist()
    )

    summaries = sorted(
        (pickle.loads(r.data) for r in derived.filter(F.col("tbl") == SUMMARY).collect()), key=lambda s: s.run
    )
    counts = {"segments": len(list_segments(data_dir)), "ranges": len(ranges), "issues": issues}
    if out_dir is not None:
        out = str(out_dir).rstrip("/")
        for table, schema in output_schemas().items():
            part = derived.filter(F.col("tbl") == table).select("data").mapInArrow(_unpack, schema)
            part.write.mode("overwrite").parquet(f"{out}/{table}")
    runs = [pa.ipc.open_stream(r.data).read_all() for r in derived.filter(F.col("tbl") == "runs").collect()]
    counts["exchanges"] = sum(sum(t.column("n_exchanges").to_pylist()) for t in runs)
    parsed.unpersist()
    derived.unpersist()
    report = Report(
        runs=summaries,
        source=str(data_dir),
        seed=seed,
        resamples=resamples or _default_resamples(),
        analyzer_version=ANALYZER_VERSION,
        expect_rules=[str(r) for r in rules],
    )
    return report, counts


def _default_resamples() -> int:
    from toolproxy.analysis.measure import stats

    return stats.RESAMPLES


def _fail(message: str) -> int:
    print(printable(f"toolproxy-spark: {message}", lines=True), file=sys.stderr)
    return 2


class JobError(Exception):
    """A mistake the user can fix (no segments, bad arguments); printed without a traceback."""


def main(argv: list[str] | None = None) -> int:
    from toolproxy.analysis.classify.expectations import RuleError, parse_rules
    from toolproxy.analysis.report import render

    ap = argparse.ArgumentParser(prog="toolproxy-spark", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data", required=True, help="the data directory the proxies record into (same path on every node)"
    )
    ap.add_argument(
        "--out", default=None, help="directory (or Hadoop URL) for the Parquet tables; omitted: report only"
    )
    ap.add_argument("--master", default=None, help="Spark master, e.g. 'local[*]' (default: what spark-submit set)")
    ap.add_argument(
        "--format",
        dest="fmt",
        default="terminal",
        choices=["terminal", "markdown", "json", "csv", "html"],
        help="report format on stdout",
    )
    ap.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        help="write the report to this file instead of stdout (spark-submit mixes the job's stderr into stdout)",
    )
    ap.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="TAG=VALUE:call|none",
        help="expectation rule, as for `toolproxy analyze --expect` (repeatable)",
    )
    ap.add_argument("--seed", type=int, default=0, help="bootstrap RNG seed, as for `toolproxy report`")
    ap.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="groups of runs analysed in parallel (default: the cores Spark has)",
    )
    ap.add_argument("--range-mb", type=float, default=RANGE_BYTES / (1 << 20), help="segment bytes per read task")
    args = ap.parse_args(argv)
    try:
        rules = parse_rules(args.expect)
    except RuleError as exc:
        ap.error(str(exc))
    if not Path(args.data).is_dir():
        return _fail(f"{args.data} is not a directory; give the data directory the proxy records into")
    if not list_segments(args.data):
        return _fail(f"no segments under {args.data}: is this the data directory the proxy records into?")
    try:
        spark = session(args.master)
    except ImportError as exc:
        return _fail(f"{exc.name or 'pyspark'} is not installed: pip install 'toolproxy-recorder[spark]'")
    except Exception as exc:  # the JVM did not start: say what is missing, not a Py4J traceback
        return _fail(
            f"Spark did not start ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "it needs Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless) or JAVA_HOME set"
        )
    spark.sparkContext.setLogLevel("WARN")
    t0 = time.perf_counter()
    try:
        report, counts = run_job(
            spark,
            args.data,
            args.out,
            rules=rules,
            seed=args.seed,
            range_bytes=max(1, int(args.range_mb * (1 << 20))),
            partitions=args.partitions,
        )
    except JobError as exc:
        return _fail(str(exc))
    finally:
        seconds = time.perf_counter() - t0
    text = render(report, args.fmt)
    if args.output is None:
        sys.stdout.write(text)
    else:
        try:
            args.output.write_text(text, encoding="utf-8")
        except OSError as exc:
            return _fail(f"cannot write {args.output}: {exc.strerror or exc}")
    issues = ", ".join(f"{v} {k}" for k, v in sorted(counts["issues"].items())) or "none"
    print(
        f"spark: {counts['exchanges']} exchanges from {counts['segments']} segments ({counts['ranges']} read tasks), "
        f"{len(report.runs)} runs in {seconds:.1f}s; issues: {issues}"
        + (f"; tables in {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
