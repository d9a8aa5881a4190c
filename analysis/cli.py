"""`toolproxy analyze`, `toolproxy sql`, `toolproxy show`: thin commands over the analysis rooms."""

from __future__ import annotations

import csv
import io
import shlex
from pathlib import Path

import click
import orjson

from toolproxy.analysis.options import (
    DATA_OPTION,
    DB_OPTION,
    MEMORY_LIMIT_OPTION,
    analyze_if_stale,
    expect_option,
    fail,
    open_store,
    terminal_safe_csv,
)
from toolproxy.term.printable import printable

# The runs just re-derived that were recorded with --sample (record/sampling.py): the rate, and
# how many exchanges only a stub stands for; from their tallies, which derive brought up to date.
_SAMPLED_QUERY = """
select run, min(try_cast(try_cast(value as json) as double)) filter (where field = 'sample_rate') as rate,
       coalesce(sum(n) filter (where field = 'kind' and value = 'sampled_out'), 0)
from run_tallies where run in (select unnest(?::varchar[])) group by run having rate < 1 order by run
"""


@click.command()
@DATA_OPTION
@DB_OPTION
@click.option(
    "--batch-mb",
    default=8.0,
    show_default=True,
    type=click.FloatRange(0.001, 1024),
    help="Input analysed together, in MB (bounds memory).",
)
@click.option(
    "--workers",
    default=None,
    type=click.IntRange(0, 64),
    help="Analysis processes (default: one per core for large ingests, 0 = in-process).",
)
@MEMORY_LIMIT_OPTION
@click.option(
    "--reclassify",
    is_flag=True,
    help="Rebuild every derived table (classification, turns, roles, episodes) from the stored raw exchanges.",
)
@expect_option(
    "What items expect, by a rule on tags, e.g. 'category=irrelevance:none' (repeatable; the last "
    "matching rule wins over the item's expect tag). Stored with the analysis and used until replaced."
)
@click.option(
    "--clear-expect", is_flag=True, help="Forget the stored expectation rules (items keep their expect tags)."
)
@click.option("--quiet", is_flag=True, help="No progress line on stderr (it is only drawn on a terminal anyway).")
def analyze(
    data_dir: Path,
    db_path: Path | None,
    batch_mb: float,
    workers: int | None,
    memory_limit: str,
    reclassify: bool,
    expect_rules: list,
    clear_expect: bool,
    quiet: bool,
) -> None:
    """Ingest new records from DATA into DuckDB and classify every turn (incremental; safe to re-run).

    When the store was analysed by another analyzer version, with other --expect rules, or with
    --reclassify, every derived row is first rebuilt from the stored raw exchanges.
    """
    import duckdb

    from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
    from toolproxy.analysis.lifecycle.ingest import ingest
    from toolproxy.analysis.lifecycle.prune import forget_pruned
    from toolproxy.analysis.lifecycle.reanalyze import ReanalyzeError, rebuild, rebuild_reason
    from toolproxy.analysis.store.state import save_state
    from toolproxy.term.progress import Progress

    if not data_dir.exists():
        fail(f"data directory {data_dir} does not exist (give --data, where `toolproxy serve` recorded)")
    if not data_dir.is_dir():
        fail(f"--data {data_dir} is not a directory")
    if not (data_dir / "segments").is_dir():
        fail(f"{data_dir} holds no recordings (no {data_dir / 'segments'} directory); is it the proxy's --data?")
    if expect_rules and clear_expect:
        fail("give --expect or --clear-expect, not both")
    rules = expect_rules or ([] if clear_expect else None)
    con = open_store(data_dir, db_path, read_only=False, memory_limit=memory_limit)
    # DuckDB draws its own bar for any statement over 2 s, into pipes and logs too; analyze has
    # its own progress line.
    con.execute("SET enable_progress_bar = false")
    try:
        reason = rebuild_reason(con, rules=rules, force=reclassify)
        if reason is not None:
            t = rebuild(
                con,
                rules,
                exchanges=reclassify or reason.startswith("analyzer version"),
                data_dir=data_dir,
                progress=Progress("analyze: reclassifying", unit="exchanges", quiet=quiet),
            )
            click.echo(
                f"rebuilt derived tables ({reason}): {t['exchanges']} exchanges reclassified, "
                f"{t['runs']} runs, {t['turns']} turns, {t['episodes']} episodes"
            )
        else:
            save_state(con, rules)  # a new store records the version and rules its first ingest is derived under
        forgotten = forget_pruned(con, data_dir)
        if forgotten["segments"]:
            click.echo(
                f"pruned segments: {forgotten['segments']}; their {forgotten['exchanges']} exchanges removed, "
                f"{forgotten['runs']} runs re-derived"
            )
        with Progress("analyze: reading segments", unit="MB", scale=1e6, quiet=quiet) as progress:
            s = ingest(con, data_dir, batch_bytes=int(batch_mb * 1024 * 1024), workers=workers, progress=progress)
        sampled = con.execute(_SAMPLED_QUERY, [s.runs]).fetchall()
    except duckdb.Error as exc:
        fail(f"analyze failed in DuckDB: {str(exc).splitlines()[0]}")
    except ReanalyzeError as exc:
        fail(str(exc))
    finally:
        con.close()
    rate = s.records / s.seconds if s.seconds > 0 else 0.0
    click.echo(
        f"segments: {s.segments} ({s.segments_read} with new data, {s.bytes_read / 1e6:.1f} MB read); "
        f"records: {s.records}; new exchanges: {s.new_exchanges}; duplicates skipped: {s.duplicates}; "
        f"fingerprints: {s.fingerprints}" + (f"; MCP exchanges: {s.mcp_exchanges}" if s.mcp_exchanges else "")
    )
    click.echo(
        printable(
            f"runs re-derived: {len(s.runs)}{_run_names(s.runs)}; "
            f"turns: {s.turns}; episodes: {s.episodes}; {s.seconds:.2f}s ({rate:,.0f} records/s, {s.workers or 'no'} "
            "worker processes)"
        )
    )
    if s.runs_in_part:
        click.echo(
            f"derived in part: {len(s.runs_in_part)} of those runs, only their {s.episodes_in_part} episodes "
            "with new records (the rest kept)"
        )
    if sampled:
        click.echo(
            printable(
                "sampled (recorded with --sample; `report` gives estimated totals): "
                + "; ".join(
                    f"{run} at {100 * rate:g}% of episodes, {n} exchanges forwarded and not stored"
                    for run, rate, n in sampled
                )
            )
        )
    if s.set_aside:
        n = sum(s.set_aside.values())
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(s.set_aside.items()))
        where = f"--db {shlex.quote(str(db_path))}" if db_path else f"--data {shlex.quote(str(data_dir))}"
        click.echo(
            f"set aside: {n} line{'s' if n != 1 else ''} that could not be stored ({kinds}); every other line was "
            f'ingested. To see them: toolproxy sql {where} "{_ISSUES_QUERY}"'
        )
    if s.issues:
        click.echo(f"issues: {len(s.issues)}")
        for line in s.issues[:20]:
            click.echo(printable(f"  {line}"))
        if len(s.issues) > 20:
            click.echo(f"  ... {len(s.issues) - 20} more")
    else:
        click.echo("issues: none")
    click.echo(
        f"analyzer version {ANALYZER_VERSION}: the rules that turned these records into outcomes (when they "
        "change, analyze rebuilds every table from the raw records)"
    )


_ISSUES_QUERY = "SELECT segment, byte_offset, record_id, kind, message FROM ingest_issues ORDER BY segment, byte_offset"


def _run_names(runs: list[str]) -> str:
    """The first eight run names in brackets, for analyze's summary line."""
    return f" ({', '.join(runs[:8])}{', ...' if len(runs) > 8 else ''})" if runs else ""


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return orjson.dumps(value, default=str).decode()
    return str(value)


def format_table(columns: list[str], rows: list[tuple], max_width: int = 60) -> str:
    """Aligned plain-text table; long cells are cut with an ellipsis so rows stay one line."""
    columns = [printable(c) for c in columns]
    cells = [[printable(_cell(v)) for v in row] for row in rows]
    cells = [[c if len(c) <= max_width else c[: max_width - 1] + "…" for c in row] for row in cells]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    out = [" | ".join(c.ljust(w) for c, w in zip(columns, widths)), "-+-".join("-" * w for w in widths)]
    out += [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


@click.command()
@click.argument("query")
@DATA_OPTION
@DB_OPTION
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
def sql(query: str, data_dir: Path, db_path: Path | None, fmt: str) -> None:
    """Run one SQL query against the analysis database (read-only) and print the result."""
    import duckdb

    from toolproxy.analysis.store.connection import bodies_in_sql

    con = open_store(data_dir, db_path, read_only=True, half_derived=True)
    try:
        with bodies_in_sql(con, data_dir):
            cur = con.execute(query)
            if cur.description is None:
                return
            columns = [d[0] for d in cur.description]
            rows = cur.fetchall()
    except duckdb.Error as exc:
        fail(f"query failed: {str(exc).strip()}")
    finally:
        con.close()
    if fmt == "json":
        text = orjson.dumps([dict(zip(columns, r)) for r in rows], default=str, option=orjson.OPT_INDENT_2).decode()
        click.echo(printable(text, lines=True))
    elif fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows([[_cell(v) for v in r] for r in rows])
        click.echo(terminal_safe_csv(buf.getvalue()), nl=False, color=True)
    else:
        click.echo(format_table(columns, rows))
        click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


@click.command()
@click.argument("exchange_id")
@DATA_OPTION
@DB_OPTION
@click.option("--raw", is_flag=True, help="Also print the raw request and response bodies.")
def show(exchange_id: str, data_dir: Path, db_path: Path | None, raw: bool) -> None:
    """Print one exchange (a unique id prefix will do): request, response, classification."""
    from toolproxy.analysis.report.show import render

    analyze_if_stale("show", data_dir, db_path)
    con = open_store(data_dir, db_path, read_only=True)
    try:
        ids = [
            r[0]
            for r in con.execute(
                "SELECT id FROM exchanges WHERE starts_with(lower(id), ?) ORDER BY id LIMIT 11",
                [exchange_id.strip().lower()],
            ).fetchall()
        ]
        if not ids:
            fail(
                f'no exchange with id {exchange_id!r} (try `toolproxy sql "select id, path, outcome from exchanges '
                'limit 20"`)'
            )
        if len(ids) > 1:
            more = ", ".join(ids[:10]) + (", ..." if len(ids) > 10 else "")
            fail(f"id prefix {exchange_id!r} is ambiguous: {more}")
        click.echo(render(con, ids[0], data_dir, raw=raw))
    finally:
        con.close()
