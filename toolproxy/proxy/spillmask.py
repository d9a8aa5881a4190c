"""`--mask` for records with a spilled body: prepared on a thread of their own, then written.

Masking a body read back from its temporary file takes time that grows with the body (seconds
for hundreds of megabytes). Done by the writer thread, it would hold every other record back
until the writer fell `behind`, and the proxy would then make every new request wait for it.
So a record with a spilled body goes through the record transform (sampling, then masking:
record/masking.py, in bounded memory) here first, and is queued for the writer only then; every
other record is transformed by the writer as before. The writer leaves a record prepared here as
it is.

What this costs: such a record reaches the writer, and a crash can take it, for as long as its
masking takes (its exchange's client has its answer by then, unless `--durability sync` holds
the answer's end until the record is on disk). At most MAX_QUEUED records wait here; more are
handed straight to the writer, which then masks them itself: slower, never lost. On shutdown
the masking under way stops at its next window and that record is counted dropped (`stopped`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

from toolproxy.proxy.flow import Addon, Service
from toolproxy.record.masking import Masker, Stopped
from toolproxy.record.model import Record
from toolproxy.record.spill import has_spilled
from toolproxy.record.writer import STOPPED, WRITER_ERROR, SegmentWriter

MAX_QUEUED = 64


class SpillMasking(Addon):
    """Wired to the writer when built: the writer's transform becomes `writer_transform` (a record
    prepared here passes as it is, any other gets `transform`: sampling, then `masker`'s
    masking), and `masker` stops at its next window when this stops."""

    def __init__(self, writer: SegmentWriter, transform: Callable[[Record], Record], masker: Masker) -> None:
        self.writer = writer
        self.transform = transform
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting = 0
        self._count = threading.Lock()  # _waiting changes on the loop and on this thread
        self._prepared: dict[int, Record] = {}  # by id: records the writer must not transform again
        self.stopping = threading.Event()
        self.masked = 0
        self._thread = threading.Thread(target=self._run, name="toolproxy-spillmask", daemon=True)
        masker.stop = self.stopping
        writer.transform = self.writer_transform

    def service(self) -> Service:
        return Service("spill masking", self.start, self.stop, off_loop=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, rec: Record, waiter: asyncio.Future | None = None) -> None:
        """The recorder's submit (on the event loop): spilled bodies come here, the rest go on."""
        if not has_spilled(rec) or self._waiting >= MAX_QUEUED or self.stopping.is_set():
            self.writer.submit(rec, waiter)
            return
        with self._count:
            self._waiting += 1
        self._queue.put((rec, waiter, asyncio.get_running_loop()))

    def writer_transform(self, rec: Record) -> Record:
        """The writer's transform: a record prepared here passes as it is."""
        if self._prepared.pop(id(rec), None) is rec:
            return rec
        return self.transform(rec)

    def report(self) -> dict:
        return {"spilled_waiting": self._waiting, "spilled_masked": self.masked}

    def stop(self, timeout: float = 10.0) -> None:
        """Stop at the next window (blocking: call from a thread or at shutdown)."""
        self.stopping.set()
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            rec, waiter, loop = item
            try:
                if self.stopping.is_set():
                    raise Stopped
                prepared = self.transform(rec)
            except Stopped:
                self._lost(loop, waiter, STOPPED, "the proxy stopped while a record with a large body was being masked")
                continue
            except Exception as exc:  # noqa: BLE001 - one record lost and counted, masking goes on
                self._lost(loop, waiter, WRITER_ERROR, f"cannot mask a record: {type(exc).__name__}: {exc}")
                continue
            self.masked += 1
            self._prepared[id(prepared)] = prepared
            try:
                loop.call_soon_threadsafe(self._hand_over, prepared, waiter)
            except RuntimeError:  # the loop is gone (shutdown)
                self._prepared.pop(id(prepared), None)
                self._done()
                self.writer.drop(1, STOPPED, "the proxy stopped before a masked record reached the writer")
        while True:  # what was still queued at shutdown
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._lost(item[2], item[1], STOPPED, "the proxy stopped before a record with a large body was masked")

    def _done(self) -> None:
        with self._count:
            self._waiting -= 1

    def _hand_over(self, rec: Record, waiter: asyncio.Future | None) -> None:
        self._done()
        self.writer.submit(rec, waiter)

    def _lost(self, loop: asyncio.AbstractEventLoop, waiter, reason: str, message: str) -> None:
        self._done()
        self.writer.drop(1, reason, message)
        if waiter is not None:
            try:
                loop.call_soon_threadsafe(lambda: waiter.done() or waiter.set_result(False))
            except RuntimeError:
                pass
