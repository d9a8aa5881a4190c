"""Keeping every derived row under one version of the rules.

The store keeps each exchange's place in the segments (where its record, bodies included, stays as
recorded) and, derived from the record, its classification, its calls, and the turns, episodes
and runs tables. Derived rows
record the ANALYZER_VERSION that produced them and the store records the version and the
expectation rules its derived tables were built under. When either changes (a newer toolproxy,
`analyze --expect ...`) or the user asks (`analyze --reclassify`), everything derived is rebuilt
from the recorded exchanges in one transaction, so a report never mixes old and new rules.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolproxy.analysis.classify.expectations import ExpectationRule
from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.analysis.store.state import save_state, stored_rules, stored_version
from toolproxy.record.segments import RecordError, RecordReader

# Exchange columns that are the record as received (the rest is derived from the record).
_RAW = (
    "id",
    "kind",
    "started_at",
    "ended_at",
    "ttfb_ms",
    "duration_ms",
    "run",
    "episode",
    "item",
    "condition",
    "tags",
    "upstream",
    "method",
    "path",
    "query",
    "status",
    "client_status",
    "error_kind",
    "error_message",
    "upstream_request",
    "condition_note",
    "request_headers",
    "response_headers",
    "segment",
    "segment_offset",
)
_BATCH = 500


def rebuild_reason(con, *, rules: Sequence[ExpectationRule] | None, force: bool) -> str | None:
    """Why the derived tables must be rebuilt before ingesting, or None when they are current."""
    if con.execute("SELECT count(*) FROM exchanges").fetchone()[0] == 0:
        return None
    if force:
        return "--reclassify"
    version = stored_version(con)
    if version != ANALYZER_VERSION:
        return f"analyzer version {version if version is not None else 'unknown'} -> {ANALYZER_VERSION}"
    if rules is not None and [str(r) for r in rules] != [str(r) for r in stored_rules(con)]:
        return "expectation rules changed"
    return None


def reclassify(con, data_dir, progress=None) -> int:
    """Re-run the per-exchange analysis over every stored exchange, from its record in the
    segments under data_dir (the bodies are not copied into the database); returns how many
    exchanges were reclassified. The caller re-derives turns and holds the transaction.
    `progress` (toolproxy.term.progress.Progress): told the number of exchanges, advanced per batch.
    A record that cannot be read any more raises ReanalyzeError: derived rows are rebuilt all
    together or not at all."""
    from toolproxy.analysis.classify.keys import Prefixes
    from toolproxy.analysis.classify.record import analyze_record
    from toolproxy.analysis.load.lines import CALL_TYPES, EXCHANGE_TYPES
    from toolproxy.analysis.store.connection import insert_columns
    from toolproxy.analysis.store.tables import CALLS, TOOL_SETS

    refs = con.execute("SELECT id, segment, segment_offset FROM exchanges ORDER BY segment, segment_offset").fetchall()
    types = {"id": "VARCHAR"} | {c: t for c, t in EXCHANGE_TYPES.items() if c not in _RAW}
    if progress is not None:
        progress.total = len(refs)
    seen_sets: set[str] = set()
    prefixes = Prefixes()  # records in segment order: a conversation's requests follow each other
    with RecordReader(data_dir) as reader:
        for start in range(0, len(refs), _BATCH):
            batch = refs[start : start + _BATCH]
            out: dict[str, list] = {c: [] for c in types}
            calls: list[dict] = []
            sets: list[dict] = []
            for exchange_id, segment, offset in batch:
                try:
                    rec = reader.record(segment, offset)
                except RecordError as exc:
                    raise ReanalyzeError(
                        f"cannot reclassify exchange {exchange_id}: {exc}. The database reads bodies from the "
                        "segments it was analysed from; give the --data that holds them"
                    ) from None
                a = analyze_record(rec, segment, offset, prefixes)
                for c in types:
                    out[c].append(a.exchange[c])
                calls.extend(a.calls)
                if a.tool_set is not None and a.tool_set.hash not in seen_sets:
                    seen_sets.add(a.tool_set.hash)
                    sets.append(a.tool_set._asdict())
            derived = [c for c in types if c != "id"]
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE _reclassified AS SELECT id, {', '.join(derived)} FROM exchanges LIMIT 0"
            )
            insert_columns(con, "_reclassified", out, types)
            assignments = ", ".join(f"{c} = r.{c}" for c in derived)
            con.execute(f"UPDATE exchanges SET {assignments} FROM _reclassified r WHERE exchanges.id = r.id")
            con.execute("DELETE FROM calls WHERE exchange_id IN (SELECT unnest(?::VARCHAR[]))", [[r[0] for r in batch]])
            CALLS.insert(con, {n: [c[n] for c in calls] for n in CALL_TYPES})
            if sets:
                TOOL_SETS.insert(con, TOOL_SETS.columns_of(sets), on_conflict="ON CONFLICT DO NOTHING")
            if progress is not None:
                progress.advance(len(batch))
    con.execute("DROP TABLE IF EXISTS _reclassified")
    _remake_mcp_rows(con, reader_for=lambda: RecordReader(data_dir))
    return len(refs)


def _remake_mcp_rows(con, reader_for) -> None:
    """The MCP records' rows made again from their records, under the current rules."""
    from toolproxy.analysis.classify.mcp import mcp_rows
    from toolproxy.analysis.store.tables import MCP_EXCHANGES

    refs = con.execute(
        "SELECT DISTINCT record_id, segment, segment_offset FROM mcp_exchanges ORDER BY segment, segment_offset"
    ).fetchall()
    if not refs:
        return
    rows: list[dict] = []
    with reader_for() as reader:
        for record_id, segment, offset in refs:
            try:
                rows.extend(mcp_rows(reader.record(segment, offset), segment, offset))
            except RecordError as exc:
                raise ReanalyzeError(
                    f"cannot reclassify MCP record {record_id}: {exc}. The database reads bodies from the "
                    "segments it was analysed from; give the --data that holds them"
                ) from None
    con.execute("DELETE FROM mcp_exchanges")
    MCP_EXCHANGES.insert(con, MCP_EXCHANGES.columns_of(rows), on_conflict="ON CONFLICT DO NOTHING")


class ReanalyzeError(Exception):
    """Derived tables cannot be rebuilt; the message says why and what to do."""


def rebuild(
    con, rules: Sequence[ExpectationRule] | None, *, exchanges: bool, data_dir=None, progress=None
) -> dict[str, int]:
    """Rebuild every derived table in one transaction: exchanges' classification (when the rules
    of classification may have changed) and all runs' turns, episodes and runs rows. `progress`
    (toolproxy.term.progress.Progress) draws the reclassifying, then the deriving; closed here."""
    from toolproxy.analysis.episodes.derive import derive

    con.execute("BEGIN TRANSACTION")
    try:
        n = reclassify(con, data_dir, progress) if exchanges else 0
        save_state(con, rules)
        runs = [r[0] for r in con.execute("SELECT DISTINCT run FROM exchanges WHERE run IS NOT NULL").fetchall()]
        if progress is not None:
            progress = progress.then("analyze: turns and episodes", unit="runs")
        totals = derive(con, runs, progress=progress) | {"exchanges": n, "runs": len(runs)}
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    finally:
        if progress is not None:
            progress.close()
    return totals
