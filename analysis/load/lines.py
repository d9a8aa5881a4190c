"""Segment lines -> the rows of a batch (Batch), in worker processes: no database.

Each line is parsed back into its record (chunked bodies put back), each exchange record analysed
(classify.record.analyze_record) and its row checked against its columns. A line that cannot be
stored (not JSON, no id, a field of the wrong type, an unknown kind) is set aside with the reason
(`Batch.issues`), never fatal: the verdict is the record reader's own (toolproxy.record.schema),
which playback reads recordings through too. Workers import this module, so it imports no DuckDB and no NumPy
either (store.tables and store.columns only declare the columns).
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolproxy.analysis.classify.keys import Prefixes
from toolproxy.analysis.classify.mcp import mcp_rows
from toolproxy.analysis.classify.record import ToolSet, analyze_record, fingerprint_row
from toolproxy.analysis.store.columns import Columns, share_strings
from toolproxy.analysis.store.tables import CALLS, EXCHANGES
from toolproxy.record import schema
from toolproxy.record.chunks import CHUNK_PREFIX, ChunkSource
from toolproxy.record.segments import parse_line
from toolproxy.runtime.gcpause import gc_paused

EXCHANGE_TYPES = {
    name: sql_type for name, sql_type in EXCHANGES.types.items() if name not in ("turn_id", "analyzer_version")
}
_EXCHANGE_VALUES = operator.itemgetter(*EXCHANGE_TYPES)
CALL_TYPES = {name: sql_type for name, sql_type in CALLS.types.items() if name not in ("turn_id", "analyzer_version")}
# The columns a record's own fields go in as they are (schema.STORED) were checked by the record
# reader; the others are made to fit by Columns.fit (a misfit there is stored as JSON text or NULL).
_DERIVED = Columns({name: sql_type for name, sql_type in EXCHANGE_TYPES.items() if name not in schema.STORED})
# Issue kinds for lines that were not stored (the others are notes about a segment).
SET_ASIDE = (*schema.SET_ASIDE, "analyze_error")


@dataclass
class Batch:
    """What one batch of lines adds to the database; built in a worker, written by the main process."""

    segment: str
    # Each exchange's values in EXCHANGE_TYPES order, taken from its row as soon as it is made (the
    # row then goes while still in cache), then transposed to exchange_columns by analyze_lines.
    exchange_rows: list[tuple] = field(default_factory=list)
    # The exchanges transposed to columns (EXCHANGE_TYPES), done in the worker by analyze_lines,
    # where every value is also made to fit its column (Columns.fit).
    exchange_columns: dict[str, list] = field(default_factory=dict)
    calls: list[dict] = field(default_factory=list)
    tool_sets: dict[str, ToolSet] = field(default_factory=dict)
    fingerprints: list[dict] = field(default_factory=list)
    # MCP records' rows (analysis.classify.mcp): beside the exchanges, never attempts.
    mcp: list[dict] = field(default_factory=list)
    issues: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    records: int = 0
    duplicates: int = 0

    def issue(self, offset: int, kind: str, message: str, record_id: str | None = None) -> None:
        self.issues.append(issue_row(self.segment, offset, kind, message, record_id))
        self.notes.append(f"{self.segment} @{offset}: {message}")


def issue_row(segment: str, offset: int, kind: str, message: str, record_id: str | None = None) -> dict[str, Any]:
    """An ingest_issues row: a line set aside (SET_ASIDE) or a note about a segment (a torn tail, a
    segment that shrank), as the workers' batches and the pipeline both write them."""
    return {
        "segment": segment,
        "byte_offset": offset,
        "kind": kind,
        "message": message,
        "seen_at": time.time(),
        "record_id": record_id,
    }


def analyze_lines(segment: str, lines: list[tuple[int, bytes | memoryview]], chunks: ChunkSource) -> Batch:
    """Parse and analyse a batch of raw segment lines. Runs in worker processes: no database.

    The cyclic garbage collector is paused meanwhile (see toolproxy.runtime.gcpause): its passes over a
    batch's parsed records and rows were ~15% of the time for nothing.
    """
    with gc_paused():
        batch = _analyze_lines(segment, lines, chunks)
        columns = _transposed(batch)
        if columns and columns["id"]:
            # what was read out of bodies is made to fit here, off the process that writes it
            columns.update(_DERIVED.fit({name: columns[name] for name in _DERIVED.types}))
            _share_repeats(columns)
            batch.exchange_columns = columns
        return batch


def _transposed(batch: Batch) -> dict[str, list]:
    rows, batch.exchange_rows = batch.exchange_rows, []
    # zip transposes in C: a comprehension per column cost ~15 us an exchange
    return dict(zip(EXCHANGE_TYPES, zip(*rows))) if rows else {}


# Text columns whose values repeat along a batch (a run's name, its model, a stack's headers...).
_REPEATING = (
    "kind",
    "run",
    "episode",
    "item",
    "condition",
    "tags",
    "upstream",
    "method",
    "path",
    "query",
    "error_kind",
    "error_message",
    "model",
    "tool_set",
    "upstream_request",
    "condition_note",
    "request_headers",
    "response_headers",
    "segment",
    "outcome",
    "sub_kind",
    "surface",
    "finish_reason",
    "content",
    "reasoning_content",
    "upstream_content",
    "stack_marker",
    "stack_marker_version",
    "call_signature",
    "protocol",
)


def _share_repeats(columns: dict[str, Any]) -> None:
    """Equal strings of each _REPEATING column as one object (share_strings): the process writing
    the batch unpickles it in ~1.8 us an exchange instead of 3.2, and here the sharing costs about
    what the smaller pickle saves."""
    for name in _REPEATING:
        columns[name] = share_strings(columns[name])


def _analyze_lines(segment: str, lines: list[tuple[int, bytes | memoryview]], chunks: ChunkSource) -> Batch:
    batch = Batch(segment)
    prefixes = Prefixes()
    ids: set[str] = set()
    for offset, line in lines:
        rec, error = parse_line(line, chunks)
        if rec is None:
            batch.issue(offset, *schema.unreadable(error))
            continue
        batch.records += 1
        rid = rec.get("id")
        bad = schema.verdict(rec)
        if bad is not None:
            batch.issue(offset, bad[0], bad[1], rid if isinstance(rid, str) and rid else None)
        elif rec.get("kind") == schema.FINGERPRINT:
            batch.fingerprints.append(fingerprint_row(rec, segment, offset))
        elif rec.get("kind") == schema.MCP:
            try:
                batch.mcp.extend(mcp_rows(rec, segment, offset))
            except Exception as exc:  # as for an exchange: reported, never fatal
                batch.issue(
                    offset, "analyze_error", f"cannot analyse MCP record {rid}: {type(exc).__name__}: {exc}", rid
                )
        elif rid in ids:
            batch.duplicates += 1
        else:
            try:
                a = analyze_record(rec, segment, offset, prefixes)
            except Exception as exc:  # one odd record must never stop an ingest; it is reported instead
                prefixes = Prefixes()  # it may have kept a walk whose links it will not store
                batch.issue(offset, "analyze_error", f"cannot analyse record {rid}: {type(exc).__name__}: {exc}", rid)
                continue
            ids.add(rid)
            batch.exchange_rows.append(_EXCHANGE_VALUES(a.exchange))
            batch.calls.extend(a.calls)
            if a.tool_set is not None:
                batch.tool_sets[a.tool_set.hash] = a.tool_set
    return batch


def analyze_range(path: str, start: int, end: int) -> Batch:
    """Read the whole lines in [start, end) of a segment and analyse them.

    Workers read the file themselves, so the main process never parses records: it only finds
    line boundaries (weighing lines that name chunked bodies, see batch_end) and writes the
    results. Chunk lines are skipped; a record's chunks come from the range read, or from earlier
    in the segment by a positioned read.
    """
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    # Lines are views of `data` (orjson parses them in place): splitting copied the whole range,
    # ~3 ms of an 8 MB batch. Blank lines are skipped (isspace only ever copies one that starts
    # with whitespace), and so are chunk lines.
    view = memoryview(data)
    find, starts_with = data.find, data.startswith
    lines: list[tuple[int, memoryview]] = []
    pos, size = 0, len(data)
    while pos < size:
        nl = find(b"\n", pos)
        if nl < 0:
            nl = size
        if (
            nl > pos
            and not starts_with(CHUNK_PREFIX, pos)
            and not (data[pos : pos + 1].isspace() and data[pos:nl].isspace())
        ):
            lines.append((start + pos, view[pos:nl]))
        pos = nl + 1
    with ChunkSource(path, data, start) as chunks:
        return analyze_lines(Path(path).name, lines, chunks)
