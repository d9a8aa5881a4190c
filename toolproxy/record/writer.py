"""Durable, non-blocking recording: a bounded queue drained by one writer thread.

The event loop only serialises a small record and appends it to a deque (no lock, no thread
wake-up per record); the writer thread wakes every `poll` seconds, or at once when a `sync`
waiter is queued, and does the writing, fsync, per-exchange log lines and the serialising of
large records. Waking per record, or serialising whole batches on the writer thread, would take
the GIL from the loop thousands of times a second and cost the proxy a quarter of its throughput.
Records are appended as JSON lines to segment files that rotate by size and age; other processes
(the analyzer) may read them while they grow.

Group commit: everything queued is written together and fsync'ed at least every `window`
seconds. In `sync` durability every record carries a waiter that is released only after the
fsync that covers it, so a response can hold its last byte until its record is on disk.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

from toolproxy.record.chunks import INLINE_BODY_CHARS, ChunkPacker
from toolproxy.record.model import Record

SEGMENT_DIR = "segments"
SEGMENT_SUFFIX = ".jsonl"
# Records up to this many body characters are serialised on the event loop when submitted (a few
# microseconds): the writer thread then holds the GIL only to join and write bytes, instead of
# taking it from the loop for whole batches. Larger ones are serialised on the writer thread, so a
# multi-megabyte context never stalls the loop. With dedup the limit is chunks.INLINE_BODY_CHARS:
# larger bodies are cut into chunks there, off the loop.
INLINE_SERIALIZE_CHARS = 256 * 1024


@dataclass
class WriterStats:
    written: int = 0
    dropped: int = 0
    write_failures: int = 0
    segments: int = 0
    degraded: bool = False
    last_error: str | None = None


class SegmentWriter:
    def __init__(
        self,
        data_dir: str | os.PathLike,
        *,
        window: float = 0.2,
        max_queue: int = 10_000,
        segment_bytes: int = 64 * 1024 * 1024,
        segment_seconds: float = 3600.0,
        log: Callable[[Record], str | None] | None = None,
        poll: float = 0.02,
        dedup: bool = True,
    ) -> None:
        self.dir = Path(data_dir) / SEGMENT_DIR
        self.window = window
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        self.log = log
        self.stats = WriterStats()
        self.poll = min(poll, window)
        self.max_queue = max_queue
        # With dedup, records with large bodies are serialised by the packer on this thread, which
        # stores repeated body content once per segment (record/chunks.py).
        self._packer = ChunkPacker() if dedup else None
        self._inline_chars = INLINE_BODY_CHARS if dedup else INLINE_SERIALIZE_CHARS
        self._buf: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="toolproxy-writer", daemon=True)
        self._file = None
        self._file_bytes = 0
        self._file_opened = 0.0
        self._seq = 0

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
        """Queue a record; never blocks. False means it was dropped (queue full)."""
        if len(self._buf) >= self.max_queue:
            self.stats.dropped += 1
            self._mark_degraded("recording queue full: the disk cannot keep up; record dropped")
            if waiter is not None:
                waiter.set_result(False)
            return False
        line = None
        if _body_chars(record) <= self._inline_chars:
            line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        self._buf.append((record, line, waiter))
        if waiter is not None:
            self._wake.set()
        return True

    async def submit_and_wait(self, record: Record) -> bool:
        """Queue a record and wait until it is fsync'ed. False if it could not be recorded."""
        fut = asyncio.get_running_loop().create_future()
        if not self.submit(record, fut):
            return False
        return await fut

    def close(self, timeout: float = 10.0) -> None:
        """Drain the queue, fsync and stop. Blocking: call from a thread or at shutdown."""
        if self._thread.is_alive():
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout)

    # ---- writer thread --------------------------------------------------------------------

    def _mark_degraded(self, message: str) -> None:
        if not self.stats.degraded or self.stats.last_error != message:
            print(f"toolproxy: RECORDING FAILED: {message}", file=sys.stderr, flush=True)
        self.stats.degraded = True
        self.stats.last_error = message

    def _open_segment(self) -> None:
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.dir / f"{stamp}-{os.getpid()}-{self._seq:04d}{SEGMENT_SUFFIX}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab", buffering=1024 * 1024)
        # Held while the file is open: prune (record/retention.py) skips a segment it cannot lock.
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._file_bytes = 0
        self._file_opened = time.monotonic()
        self.stats.segments += 1

    def _close_segment(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
            finally:
                self._file = None

    def _encode(self, batch: list[tuple[Record, bytes | None, asyncio.Future | None]]) -> bytes:
        if self._packer is not None:
            return self._packer.pack(batch, self._file)
        return b"".join(
            line if line is not None else orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE) for rec, line, _ in batch
        )

    def _write_batch(self, batch: list[tuple[Record, bytes | None, asyncio.Future | None]]) -> bool:
        try:
            if self._file is None or self._file_bytes >= self.segment_bytes or (
                time.monotonic() - self._file_opened >= self.segment_seconds
            ):
                self._close_segment()
                self._open_segment()
            data = self._encode(batch)
            self._file.write(data)
            self._file_bytes += len(data)
            return True
        except (OSError, ValueError) as exc:
            self.stats.write_failures += len(batch)
            self.stats.dropped += len(batch)
            self._mark_degraded(f"cannot write segment in {self.dir}: {exc}")
            try:
                if self._file is not None:
                    self._file.close()
            except OSError:
                pass
            self._file = None
            return False

    def _sync(self) -> bool:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            return True
        except (OSError, ValueError, AttributeError) as exc:
            self._mark_degraded(f"cannot fsync segment in {self.dir}: {exc}")
            self._file = None
            return False

    def _release(self, waiters: list[asyncio.Future], ok: bool) -> None:
        for fut in waiters:
            try:
                fut.get_loop().call_soon_threadsafe(_resolve, fut, ok)
            except RuntimeError:
                pass  # the loop is gone (shutdown); nobody is waiting any more

    def _run(self) -> None:
        dirty = False
        pending: list[asyncio.Future] = []
        last_sync = time.monotonic()
        buf = self._buf
        while True:
            stopping = self._stopping
            if not stopping:
                self._wake.wait(self.poll)
                self._wake.clear()
            batch = []
            while True:
                try:
                    batch.append(buf.popleft())
                except IndexError:
                    break
            if batch:
                ok = self._write_batch(batch)
                waiters = [w for _, _, w in batch if w is not None]
                if ok:
                    self.stats.written += len(batch)
                    dirty = True
                    pending.extend(waiters)
                else:
                    self._release(waiters, False)
                if self.log is not None:
                    for rec, _, _ in batch:
                        line = self.log(rec)
                        if line:
                            print(line, flush=True)
            now = time.monotonic()
            if dirty and (pending or stopping or now - last_sync >= self.window):
                ok = self._sync()
                if ok:
                    self.stats.degraded = False  # recovered; the counters keep the history
                self._release(pending, ok)
                pending = []
                dirty = False
                last_sync = now
            if stopping and not buf:
                break
        self._close_segment()


def _body_chars(rec: Record) -> int:
    return len(rec.request_body or "") + len(rec.response_body or "") + len(rec.client_body or "")


def _resolve(fut: asyncio.Future, ok: bool) -> None:
    if not fut.done():
        fut.set_result(ok)
