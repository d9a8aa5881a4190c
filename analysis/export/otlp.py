"""`toolproxy export --otlp URL`: the analysed exchanges as OpenTelemetry spans (docs/export.md#after-analysis).

The same span as `serve --otlp-endpoint` sends (toolproxy/otlp/spans.py, built from the recorded
record), plus what only the analyzer knows: the exchange's outcome, sub-kind and surface, its turn
(outcome, role, index, attempts, whether this attempt was the turn's last), the episode and item
keys (also for untagged traffic, whose episodes the analyzer reconstructed), and each tool call's
verdict (offered, valid, surface: calls found written in the text are events too). Span and trace
ids are derived from the exchange and its tags, so exporting again sends the same ids; the span id
differs from the live span's (a receiver keeps the first span under an id, so the verdicts would
be lost beside a live span already sent), and the span links to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import click
import duckdb

from toolproxy.analysis.store.memory import DEFAULT_MEMORY_LIMIT
from toolproxy.otlp.spans import SpanData, as_analysed, span_of
from toolproxy.record.segments import list_segments, read_segment

BATCH = 256

_ANALYSIS = """
    SELECT e.id, e.outcome, e.sub_kind, e.surface, e.analyzer_version, t.turn_id, t.turn_index, t.outcome, t.sub_kind,
           t.surface, t.role, t.n_attempts, t.final_exchange_id = e.id, t.delivered, t.expect, t.episode_key,
               t.item_key,
           t.category
    FROM exchanges e LEFT JOIN turns t ON t.turn_id = e.turn_id
    WHERE e.kind = 'exchange' {where}
"""
_NAMES = (
    "toolproxy.outcome",
    "toolproxy.sub_kind",
    "toolproxy.surface",
    "toolproxy.analyzer_version",
    "toolproxy.turn.id",
    "toolproxy.turn.index",
    "toolproxy.turn.outcome",
    "toolproxy.turn.sub_kind",
    "toolproxy.turn.surface",
    "toolproxy.turn.role",
    "toolproxy.turn.attempts",
    "toolproxy.turn.final",
    "toolproxy.turn.delivered",
    "toolproxy.expect",
    "gen_ai.conversation.id",
    "toolproxy.item_key",
    "toolproxy.category",
)
_CALLS = """
    SELECT c.exchange_id, c.idx, c.name, c.arguments_raw, c.surface, c.format, c.offered, c.valid
    FROM calls c JOIN exchanges e ON e.id = c.exchange_id WHERE true {where} ORDER BY c.exchange_id, c.idx
"""


@dataclass
class ExportCounts:
    exchanges: int = 0  # analysed exchanges found in the segments
    exported: int = 0
    failed: int = 0
    unbuilt: int = 0
    last_error: str | None = None


def analysis_by_id(
    con: duckdb.DuckDBPyConnection, runs: tuple[str, ...] = ()
) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """(the analyzer's attributes per exchange id, its calls per exchange id)."""
    where, params = ("AND e.run IN (SELECT unnest(?))", [list(runs)]) if runs else ("", [])
    extra = {
        row[0]: dict(zip(_NAMES, row[1:])) for row in con.execute(_ANALYSIS.format(where=where), params).fetchall()
    }
    calls: dict[str, list[dict]] = {}
    for ex, idx, name, arguments, surface, fmt, offered, valid in con.execute(
        _CALLS.format(where=where), params
    ).fetchall():
        calls.setdefault(ex, []).append(
            {
                "index": idx,
                "name": name,
                "arguments": arguments,
                "surface": surface,
                "format": fmt,
                "offered": offered,
                "valid": valid,
            }
        )
    return extra, calls


def analysed_spans(
    data_dir: Path,
    extra: dict[str, dict],
    calls: dict[str, list[dict]],
    *,
    content: bool,
    counts: ExportCounts,
    on_bytes: Callable[[int], None] = lambda n: None,
) -> Iterable[SpanData]:
    """A span for every analysed exchange in the segments, in the order they were recorded."""
    for segment in list_segments(data_dir):
        last = 0
        for line in read_segment(segment):
            on_bytes(line.end - last)
            last = line.end
            rec = line.record
            if rec is None or rec.get("kind", "exchange") != "exchange" or rec.get("id") not in extra:
                continue
            counts.exchanges += 1
            try:
                yield as_analysed(
                    span_of(rec, content=content, extra=extra[rec["id"]], calls=calls.get(rec["id"], [])), rec["id"]
                )
            except Exception as exc:  # noqa: BLE001 - one odd record costs its span only, and is counted
                counts.unbuilt += 1
                counts.last_error = f"cannot build a span for {rec.get('id')}: {type(exc).__name__}: {exc}"[:500]


def export_otlp(
    con: duckdb.DuckDBPyConnection,
    data_dir: Path,
    endpoint: str,
    *,
    runs: tuple[str, ...] = (),
    content: bool = False,
    on_bytes: Callable[[int], None] = lambda n: None,
) -> ExportCounts:
    """Send every analysed exchange's span to `endpoint`, BATCH at a time."""
    from toolproxy.otlp.shipper import Exporter, traces_url

    exporter = Exporter(traces_url(endpoint))
    counts = ExportCounts()
    extra, calls = analysis_by_id(con, runs)
    batch: list[SpanData] = []

    def send() -> None:
        if exporter.send(batch):
            counts.exported += len(batch)
        else:
            counts.failed += len(batch)
            counts.last_error = exporter.last_error() or "the receiver refused the spans"
        batch.clear()

    try:
        for span in analysed_spans(data_dir, extra, calls, content=content, counts=counts, on_bytes=on_bytes):
            batch.append(span)
            if len(batch) >= BATCH:
                send()
        if batch:
            send()
    finally:
        exporter.shutdown()
    return counts


def run_export(
    data_dir: Path,
    db_path: Path | None,
    endpoint: str,
    *,
    runs: tuple[str, ...] = (),
    content: bool = False,
    quiet: bool = False,
    memory_limit: str = DEFAULT_MEMORY_LIMIT,
) -> None:
    """The --otlp half of `toolproxy export`: checks, the export, one summary line; exit 1 if spans were refused."""
    from toolproxy.analysis.options import fail, open_store
    from toolproxy.analysis.store.connection import default_db
    from toolproxy.otlp.shipper import EndpointError, missing_sdk, traces_url
    from toolproxy.term.printable import printable
    from toolproxy.term.progress import Progress

    try:
        url = traces_url(endpoint)
    except EndpointError as exc:
        raise click.BadParameter(str(exc), param_hint="--otlp") from None
    if (problem := missing_sdk()) is not None:
        fail(f"--otlp: {problem}")
    if not (data_dir / "segments").is_dir():
        fail(
            f"{data_dir} holds no recordings (no {data_dir / 'segments'} directory); give --data, where `toolproxy "
            "serve` recorded"
        )
    path = db_path or default_db(data_dir)
    if not path.exists():
        fail(f"no analysis at {path}: run `toolproxy analyze --data {data_dir}` first")
    con = open_store(data_dir, db_path, read_only=True, memory_limit=memory_limit)
    try:
        total = sum(p.stat().st_size for p in list_segments(data_dir))
        with Progress("export: reading segments", unit="MB", scale=1e6, total=total, quiet=quiet) as progress:
            counts = export_otlp(con, data_dir, url, runs=runs, content=content, on_bytes=progress.advance)
    except duckdb.Error as exc:
        fail(f"export failed in DuckDB: {str(exc).splitlines()[0]}")
    finally:
        con.close()
    click.echo(
        printable(
            f"otlp: {counts.exported} spans sent to {url}; {counts.exchanges} analysed exchanges read"
            + (f"; {counts.failed} refused or undelivered" if counts.failed else "")
            + (f"; {counts.unbuilt} could not be built" if counts.unbuilt else "")
            + (f"; last error: {counts.last_error}" if counts.last_error else "")
        )
    )
    if counts.failed or counts.unbuilt:
        raise SystemExit(1)
