"""`toolproxy prune`, and dropping the rows derived from pruned segments.

Which segments are gone is read from the data directory's prune ledger (record/retention.py), not
inferred from missing files: a database shared by several data directories, or a directory
briefly unmounted, must not lose rows. Every exchange, call, fingerprint and ingest bookkeeping
row of a pruned segment is deleted in one transaction, and the runs those exchanges belonged to
are re-derived from the exchanges that remain (runs of several batches in steps, see
episodes.derive: a crash between them leaves those runs to the next analyze, which derives them
whole). An episode that spanned the pruned segment and a kept one is rebuilt from its remaining
turns: the result is exactly what a fresh `analyze` of the remaining segments derives, so
prune-then-analyze and analyze-from-scratch agree.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from toolproxy.analysis.options import DATA_OPTION, DB_OPTION, fail
from toolproxy.record.retention import prune, read_ledger
from toolproxy.term.progress import Progress
from toolproxy.term.quantities import parse_duration

_BY_SEGMENT = ("exchanges", "fingerprints", "ingest_issues", "ingest_state", "mcp_exchanges")


def forget_pruned(con, data_dir: str | Path, progress=None) -> dict[str, int]:
    """Delete the rows of every pruned segment still in the database and re-derive their runs.

    Idempotent and cheap when there is nothing to do. Returns counts of what went. `progress`
    (toolproxy.term.progress.Progress) is advanced per run re-derived.
    """
    from toolproxy.analysis.episodes.derive import derive

    gone = sorted(read_ledger(data_dir))
    counts = {"segments": 0, "exchanges": 0, "runs": 0}
    if not gone:
        return counts
    con.execute("CREATE TEMP TABLE IF NOT EXISTS _gone (segment VARCHAR)")
    con.execute("DELETE FROM _gone")
    con.execute("INSERT INTO _gone SELECT unnest(?::VARCHAR[])", [gone])
    present = con.execute(
        "SELECT count(*) FROM (SELECT segment FROM ingest_state UNION SELECT segment FROM exchanges "
        "UNION SELECT segment FROM fingerprints) s SEMI JOIN _gone USING (segment)"
    ).fetchall()[0][0]
    if not present:
        return counts
    con.execute("BEGIN TRANSACTION")
    try:
        runs = [
            r[0]
            for r in con.execute(
                "SELECT DISTINCT run FROM exchanges SEMI JOIN _gone USING (segment) "
                "UNION SELECT DISTINCT run FROM fingerprints SEMI JOIN _gone USING (segment) WHERE run IS NOT NULL"
            ).fetchall()
        ]
        counts["exchanges"] = con.execute("SELECT count(*) FROM exchanges SEMI JOIN _gone USING (segment)").fetchall()[
            0
        ][0]
        counts["segments"] = con.execute(
            "SELECT count(*) FROM ingest_state SEMI JOIN _gone USING (segment)"
        ).fetchall()[0][0]
        con.execute("DELETE FROM calls WHERE exchange_id IN (SELECT id FROM exchanges SEMI JOIN _gone USING (segment))")
        for table in _BY_SEGMENT:
            con.execute(f"DELETE FROM {table} WHERE segment IN (SELECT segment FROM _gone)")
        # Tool schemas are recorded content too: those no remaining exchange offers go with them.
        con.execute(
            "DELETE FROM tool_sets WHERE hash NOT IN (SELECT tool_set FROM exchanges WHERE tool_set IS NOT NULL)"
        )
        derive(con, runs, progress=progress, in_steps=True)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    counts["runs"] = len(runs)
    return counts


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@click.command("prune")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="DURATION",
    help="Delete segments last written longer ago than this: 90s, 30m, 12h, 7d, 2w.",
)
@click.option("--run", default=None, help="Only segments whose every record belongs to this run.")
@DATA_OPTION
@DB_OPTION
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--quiet", is_flag=True, help="No progress line on stderr (it is only drawn on a terminal anyway).")
def prune_command(
    older_than: str, run: str | None, data_dir: Path, db_path: Path | None, dry_run: bool, quiet: bool
) -> None:
    """Delete whole recorded segments older than DURATION, and the analysis rows derived from them.

    A segment a running proxy is still writing is never touched. The database is brought in line
    at once when it is free, otherwise by the next `toolproxy analyze`: it never keeps rows whose
    recorded bytes are gone, and runs and episodes are re-derived from what remains.
    """
    import duckdb

    from toolproxy.analysis.store.connection import StoreError, connect, default_db

    try:
        seconds = parse_duration(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    if not (data_dir / "segments").is_dir():
        fail(f"{data_dir} holds no recordings (no {data_dir / 'segments'} directory); is it the proxy's --data?")
    with Progress("prune: checking segments", unit="MB", scale=1e6, quiet=quiet) as progress:
        result = prune(data_dir, older_than=seconds, run=run, dry_run=dry_run, now=time.time(), progress=progress)
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {len(result.pruned)} segments ({_mb(result.bytes)})")
    for seg in result.pruned:
        click.echo(
            f"  {seg.path.name}  {_mb(seg.size)}  last written "
            f"{time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(seg.mtime))}"
        )
    if result.live:
        click.echo(f"kept {len(result.live)} segments a running proxy is writing: {', '.join(result.live)}")
    if result.kept_mixed:
        click.echo(
            f"kept {len(result.kept_mixed)} segments that also hold other runs (they go when they age out "
            f"without --run): {', '.join(result.kept_mixed)}"
        )
    db = db_path or default_db(data_dir)
    if dry_run or not db.exists():
        return
    try:
        con = connect(db)
    except StoreError as exc:
        click.echo(f"database not updated now ({exc}); the next `toolproxy analyze` removes the deleted segments' rows")
        return
    try:
        with Progress("prune: re-deriving runs", quiet=quiet) as progress:
            c = forget_pruned(con, data_dir, progress)
    except duckdb.Error as exc:
        fail(
            f"removing the pruned rows failed in DuckDB: {str(exc).splitlines()[0]}; "
            "the next `toolproxy analyze` retries"
        )
    finally:
        con.close()
    click.echo(
        f"database: removed {c['exchanges']} exchanges from {c['segments']} segments; re-derived {c['runs']} runs"
    )
