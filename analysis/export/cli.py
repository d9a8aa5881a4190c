"""`toolproxy export`: the analysis database written out for other tools, by format.

Each format is one module with an `export(con, destination, data_dir=, runs=, since=, progress=)`
function; adding one (OTLP spans, say) is an entry in EXPORT_FORMATS, not a new command.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import click

from toolproxy.analysis.options import DATA_OPTION, DB_OPTION, MEMORY_LIMIT_OPTION, analyze_if_stale, fail, open_store
from toolproxy.term.printable import printable

EXPORT_FORMATS = {"parquet": "toolproxy.analysis.export.parquet"}
# `--otlp URL` sends spans instead of writing files: analysis/export/otlp.py.


def parse_since(text: str | None, now: float) -> dt.date | None:
    """A day (2026-11-30) or a duration back from now (7d, 12h), as the first UTC day to include."""
    from toolproxy.term.quantities import parse_duration

    if text is None:
        return None
    try:
        return dt.date.fromisoformat(text.strip())
    except ValueError:
        pass
    try:
        seconds = parse_duration(text.strip())
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a day (2026-11-30) nor a duration (90s, 30m, 12h, 7d, 2w)", param_hint="--since"
        ) from None
    return dt.datetime.fromtimestamp(now - seconds, dt.UTC).date()


@click.command("export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(sorted(EXPORT_FORMATS)),
    default="parquet",
    show_default=True,
    help="What to write.",
)
@click.option(
    "--out",
    metavar="PATH|URL",
    help="A local directory or an fsspec URL: s3://bucket/prefix (needs toolproxy-recorder[s3]), "
    "gs://bucket/prefix ([gcs]), or any other scheme fsspec knows.",
)
@click.option(
    "--otlp",
    "otlp_endpoint",
    metavar="URL",
    help="Instead of files, send one OpenTelemetry span per analysed exchange to this OTLP/HTTP receiver, "
    "e.g. http://127.0.0.1:4318 (credentials go in OTEL_EXPORTER_OTLP_HEADERS, never on the command line).",
)
@click.option(
    "--otlp-content",
    is_flag=True,
    help="With --otlp: put prompts, replies, tool definitions and tool-call arguments on the spans too (sensitive).",
)
@click.option(
    "--layout",
    type=click.Choice(["whole", "pieces"]),
    default="whole",
    show_default=True,
    help="Parquet bodies: each one whole, or (pieces) as lists of content-addressed pieces stored once in "
    "pieces/, so long episodes, which resend their conversation every turn, grow linearly, not quadratically.",
)
@DATA_OPTION
@DB_OPTION
@click.option("--run", "runs", multiple=True, metavar="NAME", help="Only these runs (repeatable).")
@click.option("--since", metavar="DAY|DURATION", help="Only days from this one on: 2026-11-30, or 7d back from now.")
@MEMORY_LIMIT_OPTION
@click.option("--quiet", is_flag=True, help="No progress line on stderr (it is only drawn on a terminal anyway).")
def export(
    fmt: str,
    out: str | None,
    otlp_endpoint: str | None,
    otlp_content: bool,
    layout: str,
    data_dir: Path,
    db_path: Path | None,
    runs: tuple[str, ...],
    since: str | None,
    memory_limit: str,
    quiet: bool,
) -> None:
    """Write the analysed exchanges (with raw bodies), turns, calls, episodes and runs to PATH|URL,
    or (--otlp URL) send them to an OpenTelemetry receiver as spans carrying each turn's verdict.

    Parquet files are partitioned hive-style by day and run (table/date=YYYY-MM-DD/run=NAME/), for
    DuckDB, Spark or pandas (which takes only the day from the folders: see docs/export.md).
    Incremental and idempotent like `analyze`: only new or changed partitions are written, and a
    destination's own manifest keeps a second machine exporting there consistent. Records not
    analyzed yet are analyzed first.
    """
    import importlib

    import duckdb

    from toolproxy.analysis.export.destination import Destination, ExportError
    from toolproxy.term.progress import Progress

    if (out is None) == (otlp_endpoint is None):
        raise click.UsageError("give --out PATH|URL (files) or --otlp URL (spans), one of the two")
    analyze_if_stale("export", data_dir, db_path, memory_limit)
    if otlp_endpoint is not None:
        if since is not None:
            raise click.UsageError("--since applies to --out; --otlp sends every analysed exchange of the runs chosen")
        if layout != "whole":
            raise click.UsageError("--layout applies to --out; --otlp sends spans, not files")
        from toolproxy.analysis.export.otlp import run_export

        run_export(
            data_dir, db_path, otlp_endpoint, runs=runs, content=otlp_content, quiet=quiet, memory_limit=memory_limit
        )
        return
    if otlp_content:
        raise click.UsageError("--otlp-content goes with --otlp")
    first_day = parse_since(since, time.time())
    writer = importlib.import_module(EXPORT_FORMATS[fmt])
    try:
        dest = Destination(out)
    except ExportError as exc:
        fail(str(exc))
    con = open_store(data_dir, db_path, read_only=True, memory_limit=memory_limit)
    try:
        with Progress("export", unit="MB", scale=1e6, quiet=quiet) as progress:
            result = writer.export(
                con, dest, data_dir=data_dir, runs=list(runs) or None, since=first_day, progress=progress, layout=layout
            )
    except ExportError as exc:
        fail(str(exc))
    except duckdb.Error as exc:
        fail(f"export failed in DuckDB: {str(exc).splitlines()[0]}")
    finally:
        con.close()
    if result.recovered:
        click.echo(result.recovered)
    for t in result.tables:
        click.echo(
            f"{t.name}: partitions {t.new} new, {t.appended} appended, {t.rewritten} rewritten, "
            f"{t.unchanged} unchanged; {t.rows:,} rows in {t.files} files"
            + (
                f"; {t.stale:,} old copies of rows that moved to another day removed from pruned partitions"
                if t.stale
                else ""
            )
        )
    if result.pieces_files:
        click.echo(f"pieces: {result.pieces:,} new in {result.pieces_files} files")
    if result.pieces_indexed:
        click.echo(
            f"pieces: {result.pieces_indexed} files exported without a key file (by an older toolproxy, or the key "
            "file lost) read whole, once: their key files are written now"
        )
    where = printable(out)
    if result.export_id is None:
        click.echo(f"nothing new to export: {where} already holds every row")
    else:
        click.echo(f"wrote {result.files} files ({result.bytes / 1e6:.1f} MB) to {where} (export {result.export_id})")
