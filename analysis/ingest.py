"""Segments -> DuckDB, incrementally and idempotently.

Per segment file the byte offset after the last complete line ingested is kept in ingest_state,
updated in the same transaction as the rows it covers: a crash mid-ingest loses nothing and adds
nothing twice, and a segment the proxy is still writing is picked up where the last run stopped.
A torn last line is left for the next run. A line that cannot be stored (not JSON, no id, a
field of the wrong type, an unknown kind) is set aside: recorded in ingest_issues with the reason
and skipped, so one bad line never blocks the lines after it. Exchange ids are unique, so a
segment copied twice into the data dir adds nothing.

Each record is analysed once, here (reassembly, classification, conversation keys), so that
re-deriving turns and episodes later reads small columns rather than bodies. Work is done in
batches of about `batch_bytes` of input: memory stays bounded whatever the size of the data dir.
"""

from __future__ import annotations

import gc
import hashlib
import multiprocessing
import operator
import os
import stat
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from toolproxy.analysis.bodies import decode_body, header
from toolproxy.analysis.classify import classify
from toolproxy.analysis.columns import Columns
from toolproxy.analysis.store import BODY_FIELDS, insert_columns
from toolproxy.analysis.tables import CALLS, EXCHANGES, FINGERPRINTS, INGEST_ISSUES, TOOL_SETS
from toolproxy.analysis.turns import UNTAGGED_RUN, call_signature, conversation_keys, derive
from toolproxy.progress import Progress
from toolproxy.record.chunks import ChunkSource, is_chunk_line
from toolproxy.record.model import Record
from toolproxy.record.sampling import SAMPLED_OUT
from toolproxy.record.segments import batch_end, list_segments, parse_line
from toolproxy.stacks.markers import detect
from toolproxy.wire import OLLAMA_CHAT, OLLAMA_GENERATE, RESPONSES, Reply, Request, decode, family_of, read_request, tool_names

# What ingest writes of an exchange: every column but those set when turns are derived.
EXCHANGE_TYPES = {name: sql_type for name, sql_type in EXCHANGES.types.items() if name not in ("turn_id", "analyzer_version")}
_EXCHANGE_VALUES = operator.itemgetter(*EXCHANGE_TYPES)
CALL_TYPES = {name: sql_type for name, sql_type in CALLS.types.items() if name not in ("turn_id", "analyzer_version")}
# Record fields stored as they are in a typed column. The proxy writes each with one JSON type; a
# record where one has another was not written by it (or was damaged) and is set aside whole.
RECORD_FIELDS = [name for name, sql_type in EXCHANGE_TYPES.items()
                 if name in Record.__dataclass_fields__ and sql_type != "JSON"]
# The bodies are not stored (they are read from the segment: store.register_bodies), but a record
# whose body is not text was not written by the proxy either.
_BODIES = Columns({name: "VARCHAR" for name in BODY_FIELDS})
_RECORD = Columns({**{name: EXCHANGE_TYPES[name] for name in RECORD_FIELDS}, **_BODIES.types})
# Issue kinds for lines that were not stored (the others are notes about a segment).
SET_ASIDE = ("corrupt", "bad_type", "unknown_kind", "analyze_error")

_REWRITTEN_SURFACE = {"constrained": "constrained", "text": "text", "template": "text"}
_MARKER_BODY_LIMIT = 256 * 1024


def _json(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value, default=str).decode()


class ToolSet(NamedTuple):
    """A tool_sets row: content hash, canonical JSON, names."""

    hash: str
    tools: str
    names: list[str]


_TOOL_SETS: dict[bytes, ToolSet] = {}


def tool_set(tools: list) -> ToolSet:
    """The tool_sets row of a tools array.

    The hash is over the key-sorted JSON, so the same tools spelled in another key order are one
    set. Harnesses resend the identical array every turn, so the result is cached by a digest of
    the array as sent, which is much cheaper than re-canonicalising it.
    """
    quick = hashlib.blake2b(orjson.dumps(tools, default=str), digest_size=16).digest()
    hit = _TOOL_SETS.get(quick)
    if hit is None:
        canonical = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS, default=str)
        hit = ToolSet(hashlib.blake2b(canonical, digest_size=16).hexdigest(), canonical.decode(), tool_names(tools))
        if len(_TOOL_SETS) > 4096:
            _TOOL_SETS.clear()
        _TOOL_SETS[quick] = hit
    return hit


def _request(rec: dict, kind: str | None) -> tuple[dict | None, Request | None]:
    """The harness's request as sent (before any condition rewrite), and the same in chat terms:
    a Responses or Messages conversation becomes the message list a chat harness would send."""
    raw, _ = decode_body(
        rec.get("request_body"), rec.get("request_body_encoding"), header(rec.get("request_headers"), "content-encoding")
    )
    if not raw:
        return None, None
    try:
        req = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(req, dict):
        return None, None
    return req, read_request(kind, req)


def _reply(rec: dict, kind: str | None, which: str) -> Reply:
    if which == "client":
        raw, problem = decode_body(rec.get("client_body"), rec.get("client_body_encoding"))
        reply = decode(raw, kind)
    else:
        headers = rec.get("response_headers")
        raw, problem = decode_body(
            rec.get("response_body"), rec.get("response_body_encoding"), header(headers, "content-encoding")
        )
        reply = decode(raw, kind, header(headers, "content-type"))
    if problem is not None:
        reply.unreadable = problem
    return reply


@dataclass(slots=True)
class Analyzed:
    """One exchange's rows: its exchanges row and calls rows (dicts keyed by column, as in
    tables.EXCHANGES and CALLS, without the columns set when turns are derived) and its tools."""

    exchange: dict[str, Any]
    calls: list[dict[str, Any]] = field(default_factory=list)
    tool_set: ToolSet | None = None


def _given(value: Any, default: Any) -> Any:
    """value, or default when the record left it out (null or ""). Not `value or default`: a
    wrongly typed false-ish value ({}, false, 0) must reach the column check, not be replaced."""
    return default if value is None or value == "" else value


def analyze_record(rec: dict, segment: str, offset: int) -> Analyzed:
    """Everything the database keeps about one exchange record. Pure: no I/O."""
    path = _given(rec.get("path"), "")
    # A sampled-out exchange's stub (record/sampling.py) is counted, never analysed as a turn.
    kind = family_of(path) if rec.get("method", "POST") == "POST" and rec.get("kind", "exchange") == "exchange" else None
    is_attempt = kind is not None
    condition = _given(rec.get("condition"), "native")
    rewritten = rec.get("upstream_request") is not None
    req, request = _request(rec, kind) if is_attempt else (None, None)
    messages = request.messages if request is not None else []
    tools = request.tools if request is not None and request.tools else None

    tools_row = tool_set(tools) if tools else None
    tool_hash = tools_row.hash if tools_row else None
    names: list[str] = tools_row.names if tools_row else []

    upstream_reply = None
    view = None
    if is_attempt:
        if rec.get("client_body") is not None:
            view = _reply(rec, kind, "client")
            view_status = rec.get("client_status") if rec.get("client_status") is not None else rec.get("status")
            if rec.get("response_body") is not None:
                # The template condition sends a chat request to a raw-completion endpoint: the
                # upstream's body is in that endpoint's dialect.
                up_path = (rec.get("upstream_request") or {}).get("path")
                upstream_reply = _reply(rec, family_of(up_path) if up_path else kind, "upstream")
        else:
            view = upstream_reply = _reply(rec, kind, "upstream")
            view_status = rec.get("status")
    elif rec.get("response_body") and len(rec["response_body"]) <= _MARKER_BODY_LIMIT:
        upstream_reply = _reply(rec, kind, "upstream")

    mark = None
    if upstream_reply is not None:
        mark = detect(upstream_reply.first) or detect(upstream_reply.last)

    outcome = sub_kind = surface = None
    calls_out: list[dict[str, Any]] = []
    n_calls = None
    saw_prose = None
    chain_reply = None
    signature = None
    if view is not None:
        c = classify(
            view, status=view_status, error_kind=rec.get("error_kind"), tools=tools,
            call_surface=_REWRITTEN_SURFACE.get(condition, "native") if rewritten else "native", tool_names=names,
            tool_set=tool_hash,
        )
        outcome, sub_kind, surface, saw_prose = c.outcome, c.sub_kind, c.surface, c.harness_saw_prose
        n_calls = len(c.calls)
        exchange_id = rec.get("id")
        for call in c.calls:
            calls_out.append({
                "exchange_id": exchange_id, "idx": call.idx, "name": call.name, "arguments_raw": call.arguments_raw,
                "arguments": _json(call.arguments), "surface": call.surface, "format": call.format,
                "offered": call.offered, "validated": call.validated, "valid": call.valid,
                "schema_errors": _json(call.schema_errors),
            })
        if outcome != "non_response":
            chain_reply = (view.content, [(tc.name, tc.arguments) for tc in view.tool_calls])
        signature = call_signature([(call.name, call.arguments) for call in c.calls])

    keys = None
    model = None
    stream_asked = None
    if is_attempt:
        model = req.get("model") if req is not None and isinstance(req.get("model"), str) else None
        if model is None and upstream_reply is not None:
            model = upstream_reply.model
        if req is not None:
            stream_asked = req.get("stream")
            if stream_asked is None and kind in (OLLAMA_CHAT, OLLAMA_GENERATE):
                stream_asked = True  # Ollama's native API streams unless told not to
        previous = request.parameters.get("previous_response_id") if request is not None else None
        if isinstance(previous, str):
            # A Responses request chained to a stored response carries only the new input: the
            # earlier conversation is the server's state, named by id, so it is part of this
            # request's state too (its link to the earlier turn is made after ingest).
            messages = [{"role": "previous_response", "content": previous}, *messages]
        keys = conversation_keys(messages, tool_set=tool_hash, tool_names=names, model=model, reply=chain_reply)

    usage = upstream_reply if upstream_reply is not None else view
    record_meta = {
        "v": rec.get("v"),
        "client_path": rec.get("client_path"),
        "request_body_size": rec.get("request_body_size"),
        "response_complete": rec.get("response_complete"),
        "stream_requested": stream_asked,
        "reply_complete": view.complete if view is not None else None,
        "classification_detail": None,
        "extra": rec.get("extra") or None,
    }
    if view is not None and outcome == "non_response":
        record_meta["classification_detail"] = c.detail
    if kind == RESPONSES:
        record_meta["response_id"] = view.id if view is not None else None
        record_meta["previous_response_id"] = request.parameters.get("previous_response_id") if request is not None else None
    row = {
        "id": rec.get("id"), "kind": rec.get("kind", "exchange"), "started_at": rec.get("started_at"),
        "ended_at": rec.get("ended_at"), "ttfb_ms": rec.get("ttfb_ms"), "duration_ms": rec.get("duration_ms"),
        "run": _given(rec.get("run"), UNTAGGED_RUN), "episode": rec.get("episode"), "item": rec.get("item"),
        "condition": condition, "tags": _json(rec.get("tags") or {}), "upstream": rec.get("upstream"),
        "method": rec.get("method"), "path": path, "query": rec.get("query"), "status": rec.get("status"),
        "client_status": rec.get("client_status"), "error_kind": rec.get("error_kind"),
        "error_message": rec.get("error_message"), "is_attempt": is_attempt,
        "streamed": view.streamed if view is not None else None, "model": model,
        "prompt_tokens": usage.prompt_tokens if usage is not None else None,
        "completion_tokens": usage.completion_tokens if usage is not None else None,
        "cached_tokens": usage.cached_tokens if usage is not None else None,
        "tool_set": tool_hash, "upstream_request": _json(rec.get("upstream_request")),
        "condition_note": rec.get("condition_note"), "request_headers": _json(rec.get("request_headers")),
        "response_headers": _json(rec.get("response_headers")), "segment": segment, "segment_offset": offset,
        "record": _json(record_meta), "outcome": outcome, "sub_kind": sub_kind, "surface": surface, "n_calls": n_calls,
        "finish_reason": view.finish_reason if view is not None else None,
        "content": view.content if view is not None else None,
        "reasoning_content": view.reasoning_content if view is not None else None,
        "upstream_content": upstream_reply.content if (rewritten and upstream_reply is not None) else None,
        "harness_saw_prose": saw_prose, "stack_marker": mark.stack if mark else None,
        "stack_marker_version": mark.version if mark else None,
        "n_messages": keys.n_messages if keys else None, "state_hash": keys.state_hash if keys else None,
        "chain_hash": keys.chain_hash if keys else None, "parent_hashes": keys.parent_hashes if keys else None,
        "item_hash": keys.item_hash if keys else None, "call_signature": signature,
        "tool_results": keys.tool_results if keys else None,
    }
    return Analyzed(row, calls_out, tools_row)


def fingerprint_row(rec: dict, segment: str, offset: int) -> dict[str, Any]:
    """A fingerprint record (the stack as it described itself at start), kept whole as JSON.

    The fingerprint itself travels in the record's `extra` (toolproxy.stacks.fingerprint); a stack
    it could not identify ("unknown", "unreachable") leaves the column empty so the run falls back
    to the markers in its responses.
    """
    extra = rec.get("extra")
    fp = extra if isinstance(extra, dict) and "stack" in extra else rec
    stack = fp.get("stack")
    version = fp.get("stack_version") or fp.get("version")
    if isinstance(stack, dict):
        version = version or stack.get("version")
        stack = stack.get("name") or stack.get("stack")
    if stack in ("unknown", "unreachable"):
        stack = version = None
    return {
        "id": rec.get("id"), "run": rec.get("run"), "upstream": rec.get("upstream"), "recorded_at": rec.get("started_at"),
        "stack": stack if isinstance(stack, str) else None, "stack_version": version if isinstance(version, str) else None,
        "model": fp.get("model") if isinstance(fp.get("model"), str) else None, "record": _json(rec),
        "segment": segment, "segment_offset": offset,
    }


@dataclass
class Summary:
    segments: int = 0
    segments_read: int = 0
    bytes_read: int = 0
    records: int = 0
    new_exchanges: int = 0
    duplicates: int = 0
    fingerprints: int = 0
    new_issues: int = 0
    # Lines not stored this run, by issue kind (see SET_ASIDE).
    set_aside: dict[str, int] = field(default_factory=dict)
    torn_tails: int = 0
    workers: int = 0
    runs: list[str] = field(default_factory=list)
    turns: int = 0
    episodes: int = 0
    seconds: float = 0.0
    issues: list[str] = field(default_factory=list)


@dataclass
class Batch:
    """What one batch of lines adds to the database; built in a worker, written by the main process."""

    segment: str
    exchanges: list[dict] = field(default_factory=list)
    # The exchanges transposed to columns (EXCHANGE_TYPES), done in the worker by analyze_lines.
    exchange_columns: dict[str, list] = field(default_factory=dict)
    calls: list[dict] = field(default_factory=list)
    tool_sets: dict[str, ToolSet] = field(default_factory=dict)
    fingerprints: list[dict] = field(default_factory=list)
    issues: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    records: int = 0
    duplicates: int = 0

    def issue(self, offset: int, kind: str, message: str, record_id: str | None = None) -> None:
        self.issues.append(_issue(self.segment, offset, kind, message, record_id))
        self.notes.append(f"{self.segment} @{offset}: {message}")


def _issue(segment: str, offset: int, kind: str, message: str, record_id: str | None = None) -> dict[str, Any]:
    return {"segment": segment, "byte_offset": offset, "kind": kind, "message": message, "seen_at": time.time(),
            "record_id": record_id}


def analyze_lines(segment: str, lines: list[tuple[int, bytes]], chunks: ChunkSource) -> Batch:
    """Parse and analyse a batch of raw segment lines. Runs in worker processes: no database.

    The cyclic garbage collector is off meanwhile: a batch allocates hundreds of thousands of
    containers (parsed records, rows) and none of them form cycles, so its generation-2 passes
    over everything alive were ~15% of the time for nothing. It runs again after the batch.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        batch = _analyze_lines(segment, lines, chunks)
        rows, batch.exchanges = batch.exchanges, []
        # itemgetter + zip transpose in C: a comprehension per column cost ~15 us an exchange
        columns = dict(zip(EXCHANGE_TYPES, zip(*map(_EXCHANGE_VALUES, rows)))) if rows else {}
        bad = EXCHANGES.check.misfits(columns, RECORD_FIELDS) if columns else None
        if bad:
            _set_aside(batch, columns, bad)
        batch.exchange_columns = columns if columns and columns["id"] else {}
        return batch
    finally:
        if enabled:
            gc.enable()


def _set_aside(batch: Batch, columns: dict[str, list], bad: dict[int, str]) -> None:
    """Take out of the batch the exchanges whose record has a field of the wrong type."""
    ids = columns["id"]
    for i, problem in bad.items():
        batch.issue(columns["segment_offset"][i], "bad_type", f"record {ids[i]}: {problem}; set aside", ids[i])
    gone = {ids[i] for i in bad}
    keep = [i for i in range(len(ids)) if i not in bad]
    for name, values in columns.items():
        columns[name] = [values[i] for i in keep]
    batch.calls = [c for c in batch.calls if c["exchange_id"] not in gone]


def _analyze_lines(segment: str, lines: list[tuple[int, bytes]], chunks: ChunkSource) -> Batch:
    batch = Batch(segment)
    ids: set[str] = set()
    for offset, line in lines:
        rec, error = parse_line(line, chunks)
        if rec is None:
            batch.issue(offset, "corrupt", f"{error}; skipped")
            continue
        batch.records += 1
        rid = rec.get("id")
        kind = rec.get("kind", "exchange")
        if not isinstance(rid, str) or not rid:
            batch.issue(offset, "corrupt", "record has no id; skipped")
        elif (kind == "fingerprint" or not isinstance(kind, str)) and (problem := _RECORD.misfit(rec)):
            # exchanges are checked a column at a time, after analysis (analyze_lines)
            batch.issue(offset, "bad_type", f"record {rid}: {problem}; set aside", rid)
        elif kind == "fingerprint":
            batch.fingerprints.append(fingerprint_row(rec, segment, offset))
        elif kind not in ("exchange", SAMPLED_OUT):
            batch.issue(offset, "unknown_kind", f"record kind {kind!r} is not known to this analyzer; skipped", rid)
        elif rid in ids:
            batch.duplicates += 1
        elif problem := _BODIES.misfit(rec):
            batch.issue(offset, "bad_type", f"record {rid}: {problem}; set aside", rid)
        else:
            try:
                a = analyze_record(rec, segment, offset)
            except Exception as exc:  # one odd record must never stop an ingest; it is reported instead
                if problem := _RECORD.misfit(rec):
                    batch.issue(offset, "bad_type", f"record {rid}: {problem}; set aside", rid)
                else:
                    batch.issue(offset, "analyze_error", f"cannot analyse record {rid}: {type(exc).__name__}: {exc}", rid)
                continue
            ids.add(rid)
            batch.exchanges.append(a.exchange)
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
    lines = []
    pos = start
    for line in data.split(b"\n"):
        # isspace() stops at the first other byte; strip() would copy every line
        if line and not line.isspace() and not is_chunk_line(line):
            lines.append((pos, line))
        pos += len(line) + 1
    with ChunkSource(path, data, start) as chunks:
        return analyze_lines(Path(path).name, lines, chunks)


def _after_last_newline(f, start: int, size: int) -> int:
    """Offset just past the last newline in [start, size), or start if there is none."""
    pos = size
    while pos > start:
        step = min(1 << 16, pos - start)
        f.seek(pos - step)
        i = f.read(step).rfind(b"\n")
        if i >= 0:
            return pos - step + i + 1
        pos -= step
    return start


def _next_line_end(f, pos: int, limit: int) -> int:
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

    def __init__(self, con, data_dir: str | Path, *, batch_bytes: int = 8 << 20, workers: int | None = None,
                 progress: Progress | None = None) -> None:
        self.con = con
        self.progress = progress
        self.data_dir = Path(data_dir)
        self.batch_bytes = max(1, batch_bytes)
        self.workers = workers
        self.known_tool_sets: set[str] = {r[0] for r in con.execute("SELECT hash FROM tool_sets").fetchall()}
        self.summary = Summary()
        self.affected_runs: set[str] = set()
        # Rows and the segment offsets that cover them commit together, every commit_bytes of
        # input: per-batch commits made the WAL fsyncs dominate, and one commit per run would
        # lose all progress on a crash.
        self.commit_bytes = 256 * 1024 * 1024
        self.in_txn = False
        self.txn_bytes = 0

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
                self.summary.issues.append(f"{path.name}: file shrank below the ingested offset ({size} < {offset}); re-reading it")
                self._write_issues([_issue(path.name, offset, "segment_shrank", f"size {size} < ingested offset {offset}")])
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
                complete = _after_last_newline(f, start, size)
                pos = start
                while pos < complete:
                    end = _next_line_end(f, min(pos + self.batch_bytes, complete) - 1, complete)
                    end = batch_end(f, pos, end, self.batch_bytes)  # chunked bodies count in full
                    yield _Chunk(path, pos, end, torn_at=complete if end == complete and complete < size else None)
                    pos = end
            if complete == start and complete < size:
                yield _Chunk(path, start, start, torn_at=start)
            self.summary.bytes_read += complete - start

    def run(self) -> Summary:
        t0 = time.perf_counter()
        todo = self._pending_segments()
        new_bytes = sum(p.stat().st_size - off for p, off in todo)
        if self.progress is not None:
            self.progress.total = new_bytes
        workers = self.workers
        if workers is None:
            # Worker processes cost ~0.5 s to start: only worth it for a real amount of data.
            workers = min(os.cpu_count() or 1, 4) if new_bytes > 64 * 1024 * 1024 else 0
        self.summary.workers = workers
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
        phase = None
        self.con.execute("BEGIN TRANSACTION")
        try:
            link_stored_responses(self.con, self.affected_runs)
            phase = self.progress.then("analyze: turns and episodes", unit="runs") if self.progress is not None else None
            totals = derive(self.con, self.affected_runs, progress=phase)
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise
        finally:
            if phase is not None:
                phase.close()
        self.summary.turns, self.summary.episodes = totals["turns"], totals["episodes"]
        self.summary.runs = sorted(self.affected_runs)
        self.summary.seconds = time.perf_counter() - t0
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
            s.issues.append(f"{chunk.segment} @{chunk.torn_at}: incomplete last line (still being written, or torn by a crash); will retry next run")
            batch.issues.append(_issue(chunk.segment, chunk.torn_at, "torn_tail", "incomplete last line"))
        if not self.in_txn:
            con.execute("BEGIN TRANSACTION")
            self.in_txn, self.txn_bytes = True, 0
        try:
            if batch.exchange_columns:
                columns = batch.exchange_columns
                ids = columns["id"]
                insert_columns(con, "_ids", {"id": ids}, {"id": "VARCHAR"})
                dup = {r[0] for r in con.execute("SELECT id FROM _ids SEMI JOIN exchanges USING (id)").fetchall()}
                con.execute("DELETE FROM _ids")
                calls = batch.calls
                if dup:
                    s.duplicates += len(dup)
                    keep = [i for i, x in enumerate(ids) if x not in dup]
                    columns = {k: [v[i] for i in keep] for k, v in columns.items()}
                    calls = [r for r in calls if r["exchange_id"] not in dup]
                s.new_exchanges += EXCHANGES.insert(con, columns)
                CALLS.insert(con, {name: [r[name] for r in calls] for name in CALL_TYPES})
                self.affected_runs.update(columns["run"])
            new_sets = [v for k, v in batch.tool_sets.items() if k not in self.known_tool_sets]
            if new_sets:
                TOOL_SETS.insert(con, TOOL_SETS.columns_of([t._asdict() for t in new_sets]), on_conflict="ON CONFLICT DO NOTHING")
            if batch.fingerprints:
                s.fingerprints += FINGERPRINTS.insert(con, FINGERPRINTS.columns_of(batch.fingerprints),
                                                      on_conflict="ON CONFLICT DO NOTHING")
                self.affected_runs.update(r["run"] for r in batch.fingerprints if r["run"])
            if batch.issues:
                self._write_issues(batch.issues)
            con.execute("DELETE FROM ingest_issues WHERE segment = ? AND kind = 'torn_tail' AND byte_offset < ?", [chunk.segment, chunk.end])
            con.execute(
                "INSERT INTO ingest_state VALUES (?, ?, ?, ?, now()::TIMESTAMP) ON CONFLICT (segment) DO UPDATE SET "
                "byte_offset = excluded.byte_offset, size_seen = excluded.size_seen, "
                "n_records = ingest_state.n_records + excluded.n_records, updated_at = excluded.updated_at",
                [chunk.segment, chunk.end, chunk.end, batch.records],
            )
            self.txn_bytes += chunk.size
            if self.txn_bytes >= self.commit_bytes:
                self._commit()
        except Exception:
            con.execute("ROLLBACK")
            self.in_txn = False
            raise
        self.known_tool_sets.update(batch.tool_sets)
        if self.progress is not None:
            self.progress.advance(chunk.size)

    def _commit(self) -> None:
        if self.in_txn:
            self.con.execute("COMMIT")
            self.in_txn = False


def link_stored_responses(con, runs: set[str]) -> None:
    """Chain Responses requests to the stored response they name (`previous_response_id`): the
    earlier exchange's chain hash becomes this one's first parent, so episode reconstruction
    follows server-side state as it follows a resent message list. Idempotent."""
    if not runs:
        return
    con.execute(
        """
        UPDATE exchanges AS e SET parent_hashes = list_prepend(p.chain_hash, coalesce(e.parent_hashes, []))
        FROM exchanges AS p
        WHERE e.run IN (SELECT unnest(?::VARCHAR[]))
          AND e.record->>'previous_response_id' IS NOT NULL
          AND p.record->>'response_id' = e.record->>'previous_response_id'
          AND p.chain_hash IS NOT NULL
          AND NOT list_contains(coalesce(e.parent_hashes, []), p.chain_hash)
        """,
        [sorted(runs)],
    )


def ingest(con, data_dir: str | Path, *, batch_bytes: int = 8 << 20, workers: int | None = None,
           progress: Progress | None = None) -> Summary:
    """Ingest every new line of every segment under data_dir, then re-derive the affected runs.

    workers: processes analysing batches in parallel; None picks by the amount of new data.
    progress: told the new bytes to read, then advanced by each batch written.
    """
    con.execute("CREATE TEMP TABLE IF NOT EXISTS _ids (id VARCHAR)")
    return Ingestor(con, data_dir, batch_bytes=batch_bytes, workers=workers, progress=progress).run()
