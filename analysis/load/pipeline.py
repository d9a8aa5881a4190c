"""Segments -> DuckDB, incrementally and idempotently.

Per segment file the byte offset after the last complete line ingested is kept in ingest_state,
updated in the same transaction as the rows it covers: a crash mid-ingest loses nothing and adds
nothing twice, and a segment the proxy is still writing is picked up where the last run stopped.
A torn last line is left for the next run. A line that cannot be stored (not JSON, no id, a
field of the wrong type, an unknown kind) is set aside: recorded in ingest_issues with the reason
and skipped, so one bad line never blocks the lines after it. Exchange ids are unique, so a
segment copied twice into the data dir adds nothing.

The lines are analysed (analysis/load/lines.py) in worker processes, in batches of about
`batch_bytes` of input, while this process writes the results: memory stays bounded whatever the
size of the data dir.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np

from toolproxy.analysis.load.lines import CALL_TYPES, SET_ASIDE, Batch, analyze_range, issue_row
from toolproxy.analysis.store.connection import insert_columns
from toolproxy.analysis.store.tables import CALLS, EXCHANGES, FINGERPRINTS, INGEST_ISSUES, MCP_EXCHANGES, TOOL_SETS
from toolproxy.record.segments import batch_end, list_segments
from toolproxy.term.progress import Progress

WORKERS_ABOVE_BYTES = 16 << 20


@dataclass
class Summary:
    segments: int = 0
    segments_read: int = 0
    bytes_read: int = 0
    records: int = 0
    new_exchanges: int = 0
    duplicates: int = 0
    fingerprints: int = 0
    mcp_exchanges: int = 0
    new_issues: int = 0
    # Lines not stored this run, by issue kind (see SET_ASIDE).
    set_aside: dict[str, int] = field(default_factory=dict)
    torn_tails: int = 0
    workers: int = 0
    # What the derive after the load did (lifecycle.ingest fills these, and seconds for both).
    runs: list[str] = field(default_factory=list)
    turns: int = 0
    episodes: int = 0
    # Runs of `runs` derived only in the episodes that gained attempts, and how many those were.
    runs_in_part: list[str] = field(default_factory=list)
    episodes_in_part: int = 0
    seconds: float = 0.0
    issues: list[str] = field(default_factory=list)


def after_last_newline(f, start: int, size: int) -> int:
    """Offset just past the last newline in [start, size), or start if there is none. Spark's
    ranges (export.spark) end at the same line boundaries as analyze's batches."""
    pos = size
    while pos > start:
        step = min(1 << 16, pos - start)
        f.seek(pos - step)
        i = f.read(step).rfind(b"\n")
        if i >= 0:
            return pos - step + i + 1
        pos -= step
    return start


def next_line_end(f, pos: int, limit: int) -> int:
    """Offset just past the first newline at or after pos (limit is known to follow one)."""
    f.seek(pos)
    while pos < limit:
        buf = f.read(min(1 << 16, limit - pos))
        i = buf.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(buf)
    return limit


def _unreadable(path: Path) -> str | None:
    """Why an entry of the segments directory cannot be read as a segment, or None if it can.

    Anything can end up there (a directory named like a segment, a FIFO, a file without read
    permission, a dangling link); it is skipped with a note rather than stopping the ingest.
    """
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return "not a regular file"
        with open(path, "rb"):
            pass
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None


@dataclass
class _Chunk:
    path: Path
    start: int
    end: int
    torn_at: int | None = None

    @property
    def segment(self) -> str:
        return self.path.name

    @property
    def size(self) -> int:
        return self.end - self.start


class Ingestor:
    """Reads segments in the main process, analyses line batches in worker processes (pipelined,
    at most a few batches in flight so memory stays bounded) and writes each batch in one
    transaction together with the segment's new offset."""

    def __init__(
        self,
        con,
        data_dir: str | Path,
        *,
        batch_bytes: int = 8 << 20,
        workers: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.con = con
        self.progress = progress
        self.data_dir = Path(data_dir)
        self.batch_bytes = max(1, batch_bytes)
        self.workers = workers
        self.known_tool_sets: set[str] = {r[0] for r in con.execute("SELECT hash FROM tool_sets").fetchall()}
        self.summary = Summary()
        self.affected_runs: set[str] = set()
        self.whole_runs: set[str] = set()  # runs derive_changes must derive whole
        # Rows and the segment offsets that cover them commit together, every commit_bytes of
        # input: per-batch commits made the WAL fsyncs dominate, and one commit per run would
        # lose all progress on a crash.
        self.commit_bytes = 256 * 1024 * 1024
        self.in_txn = False
        self.txn_bytes = 0
        # Per segment, the offset this transaction reached and the records it read: written to
        # ingest_state once, just before COMMIT (an upsert per batch cost ~4 ms).
        self.reached: dict[str, tuple[int, int]] = {}
        self.stored = _StoredIds(con)

    def _pending_segments(self) -> list[tuple[Path, int]]:
        state = dict(self.con.execute("SELECT segment, byte_offset FROM ingest_state").fetchall())
        segments = []
        for path in list_segments(self.data_dir):
            why = _unreadable(path)
            if why is None:
                segments.append(path)
            else:
                self.summary.issues.append(f"{path.name}: {why}; skipped")
        self.summary.segments = len(segments)
        todo = []
        for path in segments:
            offset = state.get(path.name, 0)
            size = path.stat().st_size
            if size < offset:
                self.summary.issues.append(
                    f"{path.name}: file shrank below the ingested offset ({size} < {offset}); re-reading it"
                )
                self._write_issues(
                    [issue_row(path.name, offset, "segment_shrank", f"size {size} < ingested offset {offset}")]
                )
                offset = 0
            if size > offset:
                todo.append((path, offset))
        return todo

    def _chunks(self, todo: list[tuple[Path, int]]):
        """Ranges of about batch_bytes of whole lines. A torn tail (bytes after the last newline:
        being written, or cut by a crash) rides on the segment's last chunk and is not consumed."""
        for path, start in todo:
            self.summary.segments_read += 1
            size = path.stat().st_size
            with open(path, "rb") as f:
                complete = after_last_newline(f, start, size)
                pos = start
                while pos < complete:
                    end = next_line_end(f, min(pos + self.batch_bytes, complete) - 1, complete)
                    end = batch_end(f, pos, end, self.batch_bytes)  # chunked bodies count in full
                    yield _Chunk(path, pos, end, torn_at=complete if end == complete and complete < size else None)
                    pos = end
            if complete == start and complete < size:
                yield _Chunk(path, start, start, torn_at=start)
            self.summary.bytes_read += complete - start

    def run(self) -> Summary:
        """Load every new line; what the lines added is then derived by the caller
        (lifecycle.ingest), from affected_runs and whole_runs."""
        todo = self._pending_segments()
        new_bytes = sum(p.stat().st_size - off for p, off in todo)
        if self.progress is not None:
            self.progress.total = new_bytes
        workers = self.workers
        if workers is None:
            # A worker costs ~0.2 s of CPU to start (it imports no database) and a record 100-200 us
            # to analyse whatever its size, so 16 MB (2,500 agent turns, 10,000 small exchanges)
            # already takes longer alone than split; small exchanges went serial at 64 MB.
            workers = min(os.cpu_count() or 1, 4) if new_bytes > WORKERS_ABOVE_BYTES else 0
        self.summary.workers = workers
        with _one_thread(self.con):
            if workers <= 0:
                for chunk in self._chunks(todo):
                    self._write(chunk, analyze_range(str(chunk.path), chunk.start, chunk.end))
            else:
                ctx = multiprocessing.get_context("spawn")
                with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
                    pending: deque = deque()
                    for chunk in self._chunks(todo):
                        pending.append((chunk, pool.submit(analyze_range, str(chunk.path), chunk.start, chunk.end)))
                        if len(pending) > 2 * workers:
                            done, fut = pending.popleft()
                            self._write(done, fut.result())
                    while pending:
                        done, fut = pending.popleft()
                        self._write(done, fut.result())
            self._commit()
        return self.summary

    def _write_issues(self, issues: list[dict]) -> None:
        before = self.con.execute("SELECT count(*) FROM ingest_issues").fetchall()[0][0]
        INGEST_ISSUES.insert(self.con, INGEST_ISSUES.columns_of(issues), on_conflict="ON CONFLICT DO NOTHING")
        self.summary.new_issues += self.con.execute("SELECT count(*) FROM ingest_issues").fetchall()[0][0] - before

    def _write(self, chunk: _Chunk, batch: Batch) -> None:
        con, s = self.con, self.summary
        s.records += batch.records
        s.duplicates += batch.duplicates
        s.issues.extend(batch.notes)
        for issue in batch.issues:
            if issue["kind"] in SET_ASIDE:
                s.set_aside[issue["kind"]] = s.set_aside.get(issue["kind"], 0) + 1
        if chunk.torn_at is not None:
            s.torn_tails += 1
            s.issues.append(
                f"{chunk.segment} @{chunk.torn_at}: incomplete last line (still being written, or torn by a crash); "
                "will retry next run"
            )
            batch.issues.append(issue_row(chunk.segment, chunk.torn_at, "torn_tail", "incomplete last line"))
        if not self.in_txn:
            con.execute("BEGIN TRANSACTION")
            self.in_txn, self.txn_bytes = True, 0
        try:
            if batch.exchange_columns:
                columns = batch.exchange_columns
                ids = columns["id"]
                dup = self.stored.among(ids)
                calls = batch.calls
                if dup:
                    s.duplicates += len(dup)
                    # a request after one of these may have left its links back to the stored copy
                    # (keys.Prefixes), which an in-part derive does not read
                    self.whole_runs.update(r for r, x in zip(columns["run"], ids) if x in dup)
                    keep = [i for i, x in enumerate(ids) if x not in dup]
                    columns = {k: [v[i] for i in keep] for k, v in columns.items()}
                    calls = [r for r in calls if r["exchange_id"] not in dup]
                s.new_exchanges += EXCHANGES.insert(con, columns, fitted=True)  # by the worker
                CALLS.insert(con, {name: [r[name] for r in calls] for name in CALL_TYPES})
                self.affected_runs.update(columns["run"])
            new_sets = [v for k, v in batch.tool_sets.items() if k not in self.known_tool_sets]
            if new_sets:
                TOOL_SETS.insert(
                    con, TOOL_SETS.columns_of([t._asdict() for t in new_sets]), on_conflict="ON CONFLICT DO NOTHING"
                )
            if batch.fingerprints:
                s.fingerprints += FINGERPRINTS.insert(
                    con, FINGERPRINTS.columns_of(batch.fingerprints), on_conflict="ON CONFLICT DO NOTHING"
                )
                self.affected_runs.update(r["run"] for r in batch.fingerprints if r["run"])
            if batch.mcp:
                s.mcp_exchanges += MCP_EXCHANGES.insert(
                    con, MCP_EXCHANGES.columns_of(batch.mcp), on_conflict="ON CONFLICT DO NOTHING"
                )
            if batch.issues:
                self._write_issues(batch.issues)
            _, records = self.reached.get(chunk.segment, (0, 0))
            self.reached[chunk.segment] = (chunk.end, records + batch.records)
            self.txn_bytes += chunk.size
            if self.txn_bytes >= self.commit_bytes:
                self._commit()
        except Exception:
            self._rollback()
            raise
        self.known_tool_sets.update(batch.tool_sets)
        if self.progress is not None:
            self.progress.advance(chunk.size)

    def _commit(self) -> None:
        """Record how far each segment was read, then commit that with the rows it covers."""
        if not self.in_txn:
            return
        if self.reached:
            segments = list(self.reached)
            ends = [end for end, _ in self.reached.values()]
            records = [n for _, n in self.reached.values()]
            try:
                # a torn tail that is complete now was read: its issue goes
                self.con.execute(
                    "DELETE FROM ingest_issues AS i USING (SELECT unnest($segments) AS segment, unnest($ends) AS "
                    "reached) AS r "
                    "WHERE i.segment = r.segment AND i.kind = 'torn_tail' AND i.byte_offset < r.reached",
                    {"segments": segments, "ends": ends},
                )
                self.con.execute(
                    "INSERT INTO ingest_state SELECT unnest($segments), unnest($ends), unnest($ends), "
                    "unnest($records), "
                    "now()::TIMESTAMP ON CONFLICT (segment) DO UPDATE SET byte_offset = excluded.byte_offset, "
                    "size_seen = excluded.size_seen, n_records = ingest_state.n_records + excluded.n_records, "
                    "updated_at = excluded.updated_at",
                    {"segments": segments, "ends": ends, "records": records},
                )
            except Exception:
                self._rollback()
                raise
        self.con.execute("COMMIT")
        self.in_txn = False
        self.reached = {}

    def _rollback(self) -> None:
        """Undo the open transaction, once: a failure inside _commit rolls back before _write's
        handler sees it, and a second ROLLBACK would raise over the error that caused the first."""
        if self.in_txn:
            self.in_txn = False
            self.reached = {}
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error:  # DuckDB ended it already (a failed COMMIT): the cause is on its way out
                pass


@contextmanager
def _one_thread(con) -> Iterator[None]:
    """DuckDB on one thread while batches are written. Appending a batch scans Python objects on
    one thread anyway, and the worker processes have the cores: more DuckDB threads only added
    their synchronisation (~10% more CPU in this process, more on a loaded machine)."""
    threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
    con.execute("SET threads = 1")
    try:
        yield
    finally:
        try:
            con.execute(f"SET threads = {int(threads)}")
        except duckdb.Error:  # refused in an aborted transaction: the error on its way out says more
            pass


class _StoredIds:
    """Which exchange ids of a batch are stored already (a segment copied twice, a re-read range):
    those rows are skipped.

    Asking the database scans the id column for every batch; bounded by the batch's least and
    greatest id it skips the row groups outside them (ids are minted in time order, so a batch of
    new records overlaps few stored ones), but a fresh analyze would still scan what it stored this
    run. So the ids this run stored are remembered: the latest in a set, older ones folded into a
    sorted array of their hashes, 8 bytes an id (as strings in a set, 1M ids held ~100 MB). An id
    whose hash is among those may be stored; only those few are asked of the database, which holds
    every id this run stored. The database is asked about every id only when it held exchanges
    before the run. A failed transaction ends the run, so nothing remembered is ever rolled back.
    """

    FOLD = 65_536  # ids kept as strings before the oldest are folded into hashes, at least

    def __init__(self, con) -> None:
        self.con = con
        con.execute("CREATE TEMP TABLE IF NOT EXISTS _ids (id VARCHAR)")  # where _in_db puts the ids it asks about
        self.ask_db = con.execute("SELECT EXISTS (SELECT 1 FROM exchanges)").fetchall()[0][0]
        self.recent: set[str] = set()
        self.hashes = np.empty(0, dtype=np.int64)

    def among(self, ids: list[str]) -> set[str]:
        """The ids (unique among themselves) stored already; the others count as stored from now on."""
        if self.ask_db:
            return self._in_db(ids)
        dup = self.recent.intersection(ids)
        if len(self.hashes):
            h = np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids))
            at = np.minimum(np.searchsorted(self.hashes, h), len(self.hashes) - 1)
            maybe = [ids[i] for i in np.flatnonzero(self.hashes[at] == h)]
            if maybe:
                dup |= self._in_db(maybe)
        self.recent.update(ids)
        if len(self.recent) > max(self.FOLD, len(self.hashes) // 8):
            folded = np.fromiter(map(hash, self.recent), dtype=np.int64, count=len(self.recent))
            self.hashes = np.sort(np.concatenate([self.hashes, folded]))
            self.recent = set()
        return dup

    def _in_db(self, ids: list[str]) -> set[str]:
        insert_columns(self.con, "_ids", {"id": ids}, {"id": "VARCHAR"})
        dup = {
            r[0]
            for r in self.con.execute(
                "SELECT id FROM _ids WHERE id IN (SELECT id FROM exchanges WHERE id BETWEEN ? AND ?)",
                [min(ids), max(ids)],
            ).fetchall()
        }
        self.con.execute("DELETE FROM _ids")
        return dup


# Whether exchanges of these runs stored since their last derive (no turn yet) answered with a response id.
_NEW_RESPONSES_SQL = """
SELECT EXISTS (SELECT 1 FROM exchanges WHERE run IN (SELECT unnest(?::VARCHAR[])) AND turn_id IS NULL
               AND record->>'response_id' IS NOT NULL)
"""


def link_stored_responses(con, runs: set[str]) -> None:
    """Chain Responses requests to the stored response they name (`previous_response_id`): the
    earlier exchange's chain hash becomes this one's first parent, so episode reconstruction
    follows server-side state as it follows a resent message list. Idempotent.

    An exchange with a turn was linked, before it was derived, to every response stored by then;
    so unless the exchanges stored since (those without a turn) answered with a response id, which
    a derived request may name (a late segment), only they are linked. Bounded so, DuckDB skips
    the row groups of derived attempts (no turn_id is NULL there) instead of reading every record
    of the runs."""
    if not runs:
        return
    runs_list = sorted(runs)
    new_only = "" if con.execute(_NEW_RESPONSES_SQL, [runs_list]).fetchone()[0] else "AND e.turn_id IS NULL"
    con.execute(
        f"""
        UPDATE exchanges AS e SET parent_hashes = list_prepend(p.chain_hash, coalesce(e.parent_hashes, []))
        FROM exchanges AS p
        WHERE e.run IN (SELECT unnest(?::VARCHAR[])) {new_only}
          AND e.record->>'previous_response_id' IS NOT NULL
          AND p.record->>'response_id' = e.record->>'previous_response_id'
          AND p.chain_hash IS NOT NULL
          AND NOT list_contains(coalesce(e.parent_hashes, []), p.chain_hash)
        """,
        [runs_list],
    )
