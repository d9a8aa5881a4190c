"""Durable, non-blocking recording: a bounded queue drained by one supervised writer thread.

The event loop only serialises a small record and appends it to a deque (no lock, no thread
wake-up per record); the writer thread wakes every `poll` seconds, or at once when a `sync`
waiter is queued, and does the writing, fsync, per-exchange log lines and the serialising of
large records. Waking per record, or serialising whole batches on the writer thread, would take
the GIL from the loop thousands of times a second and cost the proxy a quarter of its throughput.
Records are appended as JSON lines to segment files that rotate by size and age; other processes
(the analyzer) may read them while they grow.

What the counters promise, because operators act on them:
- `written` counts records covered by a successful fsync, never bytes in a buffer. Each batch
  goes straight to the kernel with os.write (so a crash of this process loses only what is still
  queued), and group commit fsyncs once the oldest unsynced record has waited `window` seconds.
- Every record that does not reach disk is counted in `dropped`, by reason. A failed write or
  fsync truncates the segment back to its last fsynced byte, so what is on disk is exactly what
  was counted written, and the same segment is retried (no empty segment per failure).
- The thread is supervised: an unexpected error drops (and counts) only the records in hand,
  marks recording degraded with the cause, answers their sync waiters, and the loop goes on.
- fsync runs on its own thread, so a slow disk delays `written` and sync waiters but never the
  next write.
- Backpressure: when the oldest record the writer holds (queued, or taken and not yet written)
  for a response already answered has waited longer than MAX_QUEUE_WAIT (or half a window),
  `behind` turns true; the proxy then holds new work and answers responses as in sync mode
  until the writer catches up, so a slow writer slows responses instead of widening the window
  of records a crash can take with it.
- No record waits long behind another: what the writer takes is written in slices (at most
  SLICE_CHARS of bodies, SLICE_SECONDS of masking), and a record with a body spilled past
  `--spill-above`, whose copy can take longer than the bound, goes last and alone. While one is
  being written `writing_large` is true: responses that end meanwhile wait for their records,
  and those that ended before it was set are written ahead of it.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import fcntl
import os
import queue
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolproxy.record.chunks import INLINE_BODY_CHARS, ChunkPacker
from toolproxy.record.model import Record, encode_record
from toolproxy.record.segments import SEGMENT_DIR, SEGMENT_SUFFIX
from toolproxy.record.spill import has_spilled, record_pieces

# Names the writer in its segments' names (default: the host name). Proxies on several hosts may
# share one data directory (a network volume) or sync theirs into one bucket: the process id alone
# repeats across hosts (every container's proxy may be pid 1), the replica name does not.
REPLICA_ENV = "TOOLPROXY_REPLICA"
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
# Records up to this many body characters are serialised on the event loop when submitted (a few
# microseconds): the writer thread then holds the GIL only to join and write bytes, instead of
# taking it from the loop for whole batches. Larger ones are serialised on the writer thread, so a
# multi-megabyte context never stalls the loop. With dedup the limit is chunks.INLINE_BODY_CHARS:
# larger bodies are cut into chunks there, off the loop.
INLINE_SERIALIZE_CHARS = 256 * 1024

# The longest a record should wait in the queue before the writer takes it to the kernel. Past
# it (or half a commit window, if shorter) the writer is `behind` and the proxy applies
# backpressure: this is the bound on what a crash of the proxy process can lose.
MAX_QUEUE_WAIT = 0.1
# A slice of the records in hand, written before the next is masked and packed: a busy writer
# reaches the kernel every few milliseconds, never only once a whole batch is done.
SLICE_CHARS = 1024 * 1024
SLICE_SECONDS = 0.02

# Why a record was not written; the keys of WriterStats.dropped_reasons.
QUEUE_FULL = "queue_full"
DISK = "disk"
UNENCODABLE = "unencodable"
DISK_BUDGET = "disk_budget"
WRITER_ERROR = "writer_error"
STOPPED = "stopped"


@dataclass
class WriterStats:
    written: int = 0
    dropped: int = 0
    dropped_reasons: dict[str, int] = field(default_factory=dict)
    write_failures: int = 0  # failed write or fsync calls (each may cover many records)
    segments: int = 0
    degraded: bool = False
    last_error: str | None = None


class SegmentWriter:
    """Queue records from the event loop; a thread writes, fsyncs and counts them.

    With dedup, records with large bodies are serialised on the writer thread by a ChunkPacker,
    which stores repeated body content once per segment (record/chunks.py); an exception from it
    drops that record with the reason and recording goes on.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        *,
        window: float = 0.2,
        max_queue: int = 10_000,
        segment_bytes: int = 64 * 1024 * 1024,
        segment_seconds: float = 3600.0,
        log: Callable[[Record], str | None] | None = None,
        observe: Callable[[Record, bytes | None, bool], None] | None = None,
        poll: float = 0.02,
        dedup: bool = True,
        stall_timeout: float = 30.0,
        stream: str = "",
    ) -> None:
        self.dir = Path(data_dir) / SEGMENT_DIR
        self.stream = stream
        self.window = window
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        self.log = log
        # Told every record once it is written, on this thread (the live view's feed): must be cheap.
        # With the record's JSON line when one was made (None: not at hand), and False when a body
        # was spilled (the record then holds only a marker where that body was).
        self.observe = observe
        self.stats = WriterStats()
        self.poll = min(poll, window)
        self.lag_limit = min(window / 2, MAX_QUEUE_WAIT)
        self.max_queue = max_queue
        self._packer = ChunkPacker() if dedup else None
        self._inline_chars = INLINE_BODY_CHARS if dedup else INLINE_SERIALIZE_CHARS
        self.stall_timeout = stall_timeout
        # Read by the event loop on every request (plain attributes: no lock, no I/O).
        self.behind = False
        self.writing_large = False
        self._buf: collections.deque = collections.deque()  # (record, line | None, waiter, submitted)
        self._wake = threading.Event()
        self._stats_lock = threading.Lock()
        self._stopping = False
        self._closed = False
        self._catchup: asyncio.Future | None = None
        self._thread = threading.Thread(target=self._run, name="toolproxy-writer", daemon=True)
        self.replica = replica_name()
        # Writer-thread state: the open segment, the records taken from the queue (waiting for
        # their slice, then in hand until written) and those written but not yet handed to an fsync.
        self._seg: _Segment | None = None
        self._seq = 0
        self._waiting: collections.deque = collections.deque()
        self._hand: list = []
        # When the oldest record taken but not yet written, of a response already answered, was
        # queued: what the backpressure counts beside the queue (read by the event loop).
        self._held_since: float | None = None
        self._unsynced = 0
        self._unsynced_waiters: list[asyncio.Future] = []
        self._unsynced_since: float | None = None
        self._last_write_ok = True
        self._room_needed = 0  # bytes of the batch a full disk refused: free space to see before recovering
        # The fsync thread works through _SyncJobs in order and hands each back with its outcome.
        self._syncing: _SyncJob | None = None  # the job covering the open segment, if one is running
        self._jobs_out = 0
        self._sync_jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._sync_done: collections.deque = collections.deque()
        self._syncer = threading.Thread(target=self._sync_loop, name="toolproxy-fsync", daemon=True)
        # Called on this thread before each new segment: the disk budget makes room (record/housekeeping.py).
        self.on_new_segment: Callable[[], None] | None = None
        # Applied on this thread to every record before it is serialised (record/masking.py); while
        # set, submit leaves serialising to this thread so the event loop never does the work.
        self.transform: Callable[[Record], Record] | None = None
        # `--on-disk-full block` (record/housekeeping.py): asked before every append whether its
        # bytes fit (raises OverBudget if not), told of every byte appended or cut back.
        self.budget = None

    # ---- called from the event loop -------------------------------------------------------

    def start(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # serve anyway, degraded; every write retries the directory
            self._mark_degraded(f"cannot create {self.dir}: {exc}")
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self._buf)

    def submit(self, record: Record, waiter: asyncio.Future | None = None) -> bool:
        """Queue a record; never blocks. False means it was dropped (and counted)."""
        buf = self._buf
        if self._closed or len(buf) >= self.max_queue:
            if self._closed:
                self._drop(1, STOPPED, "the recording writer is not running")
            else:
                self._drop(1, QUEUE_FULL, "recording queue full: the disk cannot keep up; record dropped")
            if waiter is not None:
                waiter.set_result(False)
            return False
        line = None
        if self.transform is None and _body_chars(record) <= self._inline_chars and not has_spilled(record):
            line = self._line_or_drop(record, waiter)
            if line is None:
                return False
        now = time.monotonic()
        held = self._held_since
        if (buf and now - buf[0][3] > self.lag_limit) or (held is not None and now - held > self.lag_limit):
            self.behind = True
        buf.append((record, line, waiter, now))
        if waiter is not None:
            self._wake.set()
        return True

    async def submit_and_wait(self, record: Record) -> bool:
        """Queue a record and wait until it is fsync'ed. False if it could not be recorded, or if
        the disk gave no answer within `stall_timeout` (the record may still land later)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self.submit(record, fut):
            return False
        timer = loop.call_later(self.stall_timeout, self._stalled, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    async def caught_up(self) -> bool:
        """Wait (at most `stall_timeout`) until the writer is no longer behind."""
        if not self.behind:
            return True
        fut = self._catchup
        if fut is None or fut.done():
            fut = self._catchup = asyncio.get_running_loop().create_future()
        if not self.behind:  # the writer caught up before it could see the new future
            return True
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.stall_timeout)
        except TimeoutError:
            self._mark_degraded(f"recording stalled: the writer has been behind for {self.stall_timeout:g}s")
            return False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Drain the queue, fsync and stop. Blocking: call from a thread or at shutdown."""
        if self._thread.is_alive():
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                print(
                    f"toolproxy: the recording writer did not finish within {timeout:g}s; "
                    f"{len(self._buf)} queued records may be lost",
                    file=sys.stderr,
                    flush=True,
                )

    def _stalled(self, fut: asyncio.Future) -> None:
        if not fut.done():
            fut.set_result(False)
            self._mark_degraded(f"recording stalled: no fsync within {self.stall_timeout:g}s")

    # ---- bookkeeping (either thread) ------------------------------------------------------

    def _mark_degraded(self, message: str) -> None:
        # State first, then the (slow) stderr line: whoever sees a drop counted sees `degraded`.
        news = not self.stats.degraded or self.stats.last_error != message
        self.stats.degraded = True
        self.stats.last_error = message
        if news:
            print(f"toolproxy: RECORDING FAILED: {message}", file=sys.stderr, flush=True)

    def drop(self, n: int, reason: str, message: str) -> None:
        """Count records lost before they reached the writer (from any thread)."""
        self._drop(n, reason, message)

    def _drop(self, n: int, reason: str, message: str) -> None:
        self._mark_degraded(message)
        with self._stats_lock:
            self.stats.dropped += n
            self.stats.dropped_reasons[reason] = self.stats.dropped_reasons.get(reason, 0) + n

    def _line_or_drop(
        self, rec: Record, waiter: asyncio.Future | None, seg: _Segment | None = None, line: bytes | None = None
    ) -> bytes | None:
        """The bytes to append for a record (on the writer thread, for segment `seg`: with dedup,
        chunk lines first), or None once it is counted as dropped: one odd record, or a bug in
        the packer, must cost that record only."""
        try:
            if seg is not None and self._packer is not None:
                return self._packer.pack([(rec, line, None)], seg)
            return line if line is not None else encode_record(rec)
        except Exception as exc:  # noqa: BLE001 - whatever it is, count it and keep recording
            self._drop(1, UNENCODABLE, f"cannot serialise a record: {type(exc).__name__}: {exc}")
            if waiter is not None:
                self._release([waiter], False)
            return None

    def _release(self, waiters: list[asyncio.Future], ok: bool) -> None:
        for fut in waiters:
            try:
                fut.get_loop().call_soon_threadsafe(_resolve, fut, ok)
            except RuntimeError:
                pass  # the loop is gone (shutdown); nobody is waiting any more

    # ---- writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        self._syncer.start()
        while True:
            try:
                if self._cycle():
                    break
            except Exception as exc:  # noqa: BLE001 - supervision: count, report, carry on
                self._abandon(WRITER_ERROR, f"recording error: {type(exc).__name__}: {exc}")
        try:
            self._retire()
            while self._jobs_out:
                self._wait_for_syncs()
        except Exception as exc:  # noqa: BLE001 - count what it held and finish the shutdown
            self._abandon(DISK, f"cannot close segment: {type(exc).__name__}: {exc}")
        self._sync_jobs.put(None)
        self._syncer.join()
        self._closed = True
        leftover = self._take_all()
        if leftover:
            self._drop(len(leftover), STOPPED, "records queued after the writer stopped")
            self._release([w for _, _, w, _ in leftover if w is not None], False)

    def _take_all(self) -> list:
        out, buf = [], self._buf
        while True:
            try:
                out.append(buf.popleft())
            except IndexError:
                return out

    def _cycle(self) -> bool:
        """One round: settle finished fsyncs, take what is queued, write it, start an fsync when
        due. True once stopping and the queue is empty."""
        stopping = self._stopping
        buf = self._buf
        if not self._sync_done and not ((stopping or self.behind) and buf):
            self._wake.wait(self.poll)
            self._wake.clear()
        self._collect_syncs()
        self._hold(self._take_all())
        try:
            while self._waiting:
                if not self.writing_large and _is_large(self._waiting[0]):
                    # Copying it may take longer than the crash bound: from now on a response that
                    # ends waits for its record (forward.py), and the records of those that ended
                    # before this was set go ahead of it.
                    self.writing_large = True
                    self._hold(self._take_all())
                self._next_slice()
                self._write_hand()
        finally:
            self.writing_large = False
            self._held_since = None
        if (
            self._unsynced
            and self._syncing is None
            and (
                self._unsynced_waiters
                or stopping
                or self.stats.degraded
                or time.monotonic() - self._unsynced_since >= self.window
            )
        ):
            self._start_sync()
        if self.behind and (not buf or time.monotonic() - buf[0][3] <= self.lag_limit):
            self.behind = False
            fut = self._catchup
            if fut is not None:
                self._release([fut], True)
        return stopping and not buf

    def _hold(self, taken: list) -> None:
        """Records taken from the queue wait for their slice in order, except that those with a
        spilled body go behind all the others."""
        if not taken:
            return
        waiting = self._waiting
        if (waiting and _is_large(waiting[-1])) or any(map(_is_large, taken)):
            ordered = sorted([*waiting, *taken], key=_is_large)  # stable: order kept otherwise
            waiting.clear()
            waiting.extend(ordered)
        else:
            waiting.extend(taken)

    def _next_slice(self) -> None:
        """Move the next records into hand, transformed (masked, sampled): until they hold
        SLICE_CHARS of bodies (or what the open segment has room for: rotation is checked before
        each slice, so a segment ends at most a record past its size) or took SLICE_SECONDS, or
        one large record alone. A record goes in hand before its transform runs, so a failing
        transform counts it dropped."""
        waiting, hand, transform = self._waiting, self._hand, self.transform
        self._held_since = next((t for _, _, waiter, t in waiting if waiter is None), None)
        seg = self._seg
        room = self.segment_bytes - seg.end if seg is not None and seg.end < self.segment_bytes else self.segment_bytes
        limit = min(SLICE_CHARS, room)
        started = time.monotonic()
        chars = 0
        while waiting:
            large = _is_large(waiting[0])
            if hand and (large or chars >= limit or time.monotonic() - started >= SLICE_SECONDS):
                return
            item = waiting.popleft()
            hand.append(item)
            rec, line, waiter, submitted = item
            if transform is not None:
                hand[-1] = (transform(rec), line, waiter, submitted)
            if large:
                return
            chars += _body_chars(rec) if line is None else len(line)

    def _write_hand(self) -> None:
        taken = self._hand
        try:
            seg = self._writable_segment()
        except OSError as exc:
            self._hand = []
            self._write_failed(exc, len(taken), [w for _, _, w, _ in taken if w is not None], 0)
            seg = None
        ready, data, written = [], b"", []
        if seg is not None:
            rest, spilled = [], []
            for item in taken:
                (spilled if item[1] is None and has_spilled(item[0]) else rest).append(item)
            for rec, _, waiter, submitted in spilled:
                if self._write_spilled(seg, rec, waiter, submitted) and self.observe is not None:
                    self.observe(rec, None, False)
            ready, data = self._pack(rest, seg)
            self._hand = ready  # until the bytes are in the kernel: what an unexpected error would lose
        if ready:
            waiters = [w for _, _, w, _ in ready if w is not None]
            try:
                self._append(seg, data)
            except OSError as exc:
                self._hand = []
                self._write_failed(exc, len(ready), waiters, len(data))
            else:
                written = ready
                self._last_write_ok = True
                if self._unsynced_since is None:
                    self._unsynced_since = ready[0][3]
                self._unsynced += len(ready)
                self._unsynced_waiters.extend(waiters)
        self._hand = []
        if not self._unsynced:
            self._unsynced_since = None
        if self.log is not None:
            self._print_log(taken)
        if self.observe is not None:
            for rec, line, _, _ in written:
                self.observe(rec, line, True)

    def _write_spilled(self, seg: _Segment, rec: Record, waiter, submitted: float) -> bool:
        """A record with a body spilled to a temporary file, streamed from it in pieces so it is
        never held whole (and not deduplicated), cut back whole if any piece fails."""
        start = seg.end
        try:
            for piece in record_pieces(rec):
                self._append(seg, piece)
        except OSError as exc:
            self._rollback(seg, start)
            self._write_failed(exc, 1, [waiter] if waiter is not None else [], seg.end - start)
            return False
        except Exception as exc:  # noqa: BLE001 - count it and keep recording, as _line_or_drop does
            self._rollback(seg, start)
            self._drop(1, UNENCODABLE, f"cannot serialise a record: {type(exc).__name__}: {exc}")
            if waiter is not None:
                self._release([waiter], False)
            return False
        self._last_write_ok = True
        if self._unsynced_since is None:
            self._unsynced_since = submitted
        self._unsynced += 1
        if waiter is not None:
            self._unsynced_waiters.append(waiter)
        return True

    def _pack(self, taken: list, seg: _Segment) -> tuple[list, bytes]:
        """(the records that will be written, their bytes) for segment `seg`. The whole batch in
        one call to the packer; if that fails, record by record, so one bad record costs only
        itself (the packer then starts a fresh index: it never points at chunks not written)."""
        if self._packer is not None:
            try:
                return taken, self._packer.pack([(rec, line, None) for rec, line, _, _ in taken], seg)
            except Exception:  # noqa: BLE001 - found again, and counted, record by record below
                pass
        ready, parts = [], []
        for rec, line, waiter, submitted in taken:
            packed = self._line_or_drop(rec, waiter, seg, line)
            if packed is not None:
                seg.pending += len(packed)
                parts.append(packed)
                # Packed, the bytes are chunk lines and a record pointing at them: the record's own
                # line (or None) is what the live view is told.
                ready.append((rec, line if self._packer is not None else packed, waiter, submitted))
        return ready, b"".join(parts)

    def _write_failed(self, exc: OSError, records: int, waiters: list, size: int) -> None:
        self._last_write_ok = False
        if isinstance(exc, OverBudget):
            self._drop(records, DISK_BUDGET, str(exc))
        else:
            self.stats.write_failures += 1
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self._room_needed = max(size, 1)
            self._drop(records, DISK, f"cannot write segment in {self.dir}: {exc}")
        self._release(waiters, False)

    def _writable_segment(self) -> _Segment:
        seg = self._seg
        if (
            seg is None
            or seg.end >= self.segment_bytes
            or (seg.end and time.monotonic() - seg.opened >= self.segment_seconds)
        ):
            self._retire()
            seg = self._seg = self._open_segment()
        return seg

    def _append(self, seg: _Segment, data: bytes) -> None:
        start = seg.end
        seg.pending = 0
        budget = self.budget
        if budget is not None:
            budget.check(len(data))  # before a byte is written: OverBudget leaves the segment as it was
        view = memoryview(data)
        try:
            while view:
                view = view[self._os_write(seg.fd, view) :]
        except OSError:
            self._rollback(seg, start)
            raise
        seg.end += len(data)
        if budget is not None:
            budget.appended(len(data))

    def _open_segment(self) -> _Segment:
        if self.on_new_segment is not None:
            self.on_new_segment()
        self.dir.mkdir(parents=True, exist_ok=True)
        while True:
            # A new file of its own (O_EXCL): two writers in one process may open in the same second.
            # The name's time is for people (and sorts one writer's segments); the analyzer orders
            # nothing by it, since replicas' clocks may disagree.
            self._seq += 1
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            path = self.dir / f"{stamp}-{os.getpid()}-{self._seq:04d}-{self.replica}{self.stream}{SEGMENT_SUFFIX}"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
                break
            except FileExistsError:
                continue
        # Held until the fd is closed: prune (record/retention.py) skips a segment it cannot lock,
        # and an empty one (this one, until its first write).
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.stats.segments += 1
        return _Segment(fd, path, time.monotonic())

    def _retire(self) -> None:
        """Stop writing to the open segment. Its last fsync and close go to the fsync thread, so
        rotation never waits for the disk; an empty segment is removed at once."""
        seg, self._seg, self._syncing = self._seg, None, None
        if seg is None:
            return
        if seg.end == 0:
            self._close(seg)
        else:
            self._start_sync(seg, close=True)

    def _start_sync(self, seg: _Segment | None = None, close: bool = False) -> None:
        """Hand the written-but-unsynced records to the fsync thread. Writing goes on meanwhile,
        so a slow fsync delays only the `written` count and sync waiters, never the next write."""
        seg = seg or self._seg
        job = _SyncJob(seg, seg.end, self._unsynced, self._unsynced_waiters, close)
        self._unsynced, self._unsynced_waiters, self._unsynced_since = 0, [], None
        if not close:
            self._syncing = job
        self._jobs_out += 1
        self._sync_jobs.put(job)

    def _sync_loop(self) -> None:
        """The fsync thread: one fsync at a time, each outcome handed back to the writer thread,
        which alone changes segments and counters."""
        while True:
            job = self._sync_jobs.get()
            if job is None:
                return
            seg = job.seg
            try:
                self._os_fsync(seg.fd)
                error = None if os.fstat(seg.fd).st_nlink else f"segment {seg.path} was deleted while being written"
            except Exception as exc:  # noqa: BLE001 - every failure is the writer's to count
                error = f"cannot fsync segment {seg.path}: {type(exc).__name__}: {exc}"
            self._sync_done.append((job, error))
            self._wake.set()

    def _wait_for_syncs(self) -> None:
        if not self._sync_done:
            self._wake.wait(self.poll)
            self._wake.clear()
        self._collect_syncs()

    def _collect_syncs(self) -> None:
        done = self._sync_done
        while done:
            job, error = done.popleft()
            self._jobs_out -= 1
            if job is self._syncing:
                self._syncing = None
            self._settle(job, error)

    def _settle(self, job: _SyncJob, error: str | None) -> None:
        seg = job.seg
        if error is None and not seg.broken:
            seg.durable = job.end
            recovered = (
                self.stats.degraded and self._last_write_ok and len(self._buf) < self.max_queue and self._has_room()
            )
            if recovered:
                self.stats.degraded = False  # before the count: whoever sees it sees health ok
            with self._stats_lock:
                self.stats.written += job.records
            if recovered:  # last_error and the counters keep the history
                print(
                    f"toolproxy: recording recovered ({self.stats.dropped} records dropped so far)",
                    file=sys.stderr,
                    flush=True,
                )
            self._release(job.waiters, True)
        else:
            # Nothing past the segment's last fsynced byte can be trusted: drop (and count) all
            # of it and cut it off, so that what is on disk is exactly what was counted written.
            lost, waiters = job.records, list(job.waiters)
            if error is not None:
                self.stats.write_failures += 1
                self._last_write_ok = False
            if seg is self._seg:
                lost += self._unsynced
                waiters += self._unsynced_waiters
                self._unsynced, self._unsynced_waiters, self._unsynced_since = 0, [], None
            if "deleted" in (error or ""):
                seg.broken = True
                if seg is self._seg:
                    self._retire()
            else:
                self._rollback(seg, seg.durable)
            self._drop(lost, DISK, error or f"records written to {seg.path} after a failed fsync")
            self._release(waiters, False)
        if job.close and seg.fd is not None:
            self._close(seg)

    def _has_room(self) -> bool:
        """After a full disk, a small record can still fit in the last page of a segment; only
        room for what failed counts as recovered, so `block` mode does not flap."""
        if not self._room_needed:
            return True
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return False
        if st.f_bavail * st.f_frsize < self._room_needed:
            return False
        self._room_needed = 0
        return True

    def _rollback(self, seg: _Segment, size: int) -> None:
        """Cut a segment back to `size` bytes after a failed write or fsync; if even that fails,
        stop using it (the next write opens a new one)."""
        seg.pending = 0
        try:
            os.ftruncate(seg.fd, size)
            if self.budget is not None and seg.end - size:
                self.budget.appended(size - seg.end)
            seg.end = size
            seg.broken = False
        except OSError:
            seg.broken = True
            if seg is self._seg:
                self._retire()

    def _close(self, seg: _Segment) -> None:
        """Close a segment's file; one that holds no fsynced record is removed, not left behind."""
        fd, seg.fd = seg.fd, None
        if fd is None:
            return
        try:
            os.close(fd)
        except OSError:
            pass
        if seg.durable == 0:
            try:
                seg.path.unlink()
                self.stats.segments -= 1
            except OSError:
                pass

    def _abandon(self, reason: str, message: str) -> None:
        """After an unexpected error: count every record taken, in hand or unsynced, answer their waiters."""
        hand, self._hand = [*self._hand, *self._waiting], []
        self._waiting.clear()
        waiters = [w for _, _, w, _ in hand if w is not None] + self._unsynced_waiters
        lost = len(hand) + self._unsynced
        self._unsynced, self._unsynced_waiters, self._unsynced_since = 0, [], None
        seg = self._seg
        if seg is not None and seg.fd is not None:
            running = self._syncing
            self._rollback(seg, running.end if running is not None and running.seg is seg else seg.durable)
        self._drop(lost, reason, message)
        self._release(waiters, False)

    def _print_log(self, hand: list) -> None:
        try:
            lines = [self.log(rec) for rec, _, _, _ in hand]
            text = "".join(line + "\n" for line in lines if line)
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()
        except Exception as exc:  # noqa: BLE001 - a broken stdout or log line must not cost records
            self.log = None
            print(f"toolproxy: per-exchange log lines stopped: {exc}", file=sys.stderr, flush=True)

    # The two system calls a failing disk answers with errors; tests replace them to inject faults.
    _os_write = staticmethod(os.write)
    _os_fsync = staticmethod(os.fsync)


@dataclass(eq=False)
class _Segment:
    """One segment file as the writer thread sees it."""

    fd: int | None
    path: Path
    opened: float
    end: int = 0  # bytes written
    durable: int = 0  # bytes covered by a successful fsync
    broken: bool = False  # cut back or given up after a failure: later fsyncs of it count nothing
    pending: int = 0  # bytes packed for the next write, not yet written

    def tell(self) -> int:
        """Where the next packed bytes will land: the ChunkPacker's offsets are relative to it, and
        a value other than the one it expects (a write that did not land) makes it start afresh."""
        return self.end + self.pending


@dataclass(eq=False)
class _SyncJob:
    seg: _Segment
    end: int
    records: int
    waiters: list
    close: bool


def replica_name() -> str:
    """This writer's name in segment names: $TOOLPROXY_REPLICA, else the host name (a pod's or a
    container's own), reduced to letters, digits, `_`, `.` and `-` so it is safe in a file name
    and in an object store key."""
    raw = os.environ.get(REPLICA_ENV) or socket.gethostname()
    return _NOT_IN_NAME.sub("_", raw).strip("._-")[:64] or "host"


class OverBudget(OSError):
    """An append that would take the segments past `--max-disk` under `--on-disk-full block`."""


def _is_large(item: tuple) -> bool:
    """Whether a queued record has a body spilled to a file (its copy is the writer's long work)."""
    return item[1] is None and has_spilled(item[0])


def _body_chars(rec: Record) -> int:
    return len(rec.request_body or "") + len(rec.response_body or "") + len(rec.client_body or "")


def _resolve(fut: asyncio.Future, ok: bool) -> None:
    if not fut.done():
        fut.set_result(ok)
