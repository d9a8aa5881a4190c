"""`serve --retain` and `serve --max-disk`: retention and a disk budget, on a thread of their own.

Listing, stat'ing and deleting segments is disk work, so it never runs on the event loop: a
daemon thread looks every `interval` seconds. Deleting goes through record/retention.py, so a
segment the writer has open is never touched and every deletion is in the prune ledger for the
analyzer. Over budget, the oldest closed segments go first (`prune`), or (`block`) nothing is
deleted and the proxy answers 503 until an operator makes room: the refusals are recorded (a few
hundred bytes each), the exchanges they stand for were never forwarded, so nothing is lost
uncounted either way.

In `prune` mode the writer calls make_room on its own thread before it opens each segment, and
the oldest closed segments go until the new one fits, so the budget holds however fast traffic
arrives. `headroom` (the proxy gives two segments' size) covers the new segment and the one just
closed, which is still being fsync'ed and cannot be pruned yet. Beyond that the budget can be
exceeded only by what a segment takes past its rotation size: rotation is checked before each
batch of records, so by at most one batch.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from toolproxy.record.retention import data_dir_bytes, prune


@dataclass
class HousekeepingStats:
    pruned_segments: int = 0
    pruned_bytes: int = 0
    segment_bytes: int = 0
    last_error: str | None = None


class Housekeeper:
    def __init__(self, data_dir: str | Path, *, retain: float | None, max_bytes: int | None,
                 on_full: str = "prune", headroom: int = 0, interval: float | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.retain = retain
        self.max_bytes = max_bytes
        self.on_full = on_full
        self.headroom = headroom
        # Blocking has to notice a full budget soon; retention needs only a fraction of its period.
        self.interval = interval if interval is not None else (0.25 if max_bytes else min(60.0, (retain or 240) / 4))
        self.stats = HousekeepingStats()
        self.refusal: str | None = None  # set while --on-disk-full block refuses traffic
        self._stop = threading.Event()
        self._pruning = threading.Lock()  # the writer thread and this one both prune
        self._thread = threading.Thread(target=self._run, name="toolproxy-housekeeping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Blocking: call from an executor or at shutdown."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def snapshot(self) -> dict:
        s = self.stats
        return {"retain_s": self.retain, "max_disk_bytes": self.max_bytes, "on_disk_full": self.on_full,
                "segment_bytes": s.segment_bytes, "pruned_segments": s.pruned_segments, "pruned_bytes": s.pruned_bytes,
                "refusing": self.refusal is not None, "last_error": s.last_error}

    def _run(self) -> None:
        while True:
            try:
                self.tick()
            except OSError as exc:
                self.stats.last_error = f"housekeeping in {self.data_dir}: {exc}"
                print(f"toolproxy: {self.stats.last_error}", file=sys.stderr, flush=True)
            if self._stop.wait(self.interval):
                return

    def make_room(self) -> None:
        """Before a new segment: prune the oldest closed segments until it fits in the budget, or
        (block mode) start refusing when it does not."""
        if self.max_bytes is None:
            return
        try:
            if self.on_full == "prune":
                self._prune(None, self.max_bytes - self.headroom, "disk budget")
            else:
                self._check_budget()
        except OSError as exc:
            self.stats.last_error = f"making room in {self.data_dir}: {exc}"

    def _prune(self, older_than: float | None, max_bytes: int | None, why: str) -> None:
        with self._pruning:
            result = prune(self.data_dir, older_than=older_than, max_bytes=max_bytes, now=time.time())
            self.stats.pruned_segments += len(result.pruned)
            self.stats.pruned_bytes += result.bytes
        if result.pruned:
            print(f"toolproxy: pruned {len(result.pruned)} segments ({result.bytes / 1e6:.1f} MB): {why}",
                  file=sys.stderr, flush=True)

    def tick(self) -> None:
        if self.retain is not None:
            self._prune(self.retain, None, "retention")
        self._check_budget()

    def _check_budget(self) -> None:
        size = data_dir_bytes(self.data_dir)
        self.stats.segment_bytes = size
        if self.max_bytes is not None and self.on_full == "block":
            full = size >= self.max_bytes
            if full and self.refusal is None:
                print(f"toolproxy: disk budget reached ({size} of {self.max_bytes} bytes); refusing new requests "
                      "with 503 until segments are pruned", file=sys.stderr, flush=True)
            elif not full and self.refusal is not None:
                print("toolproxy: back under the disk budget; serving again", file=sys.stderr, flush=True)
            self.refusal = (
                f"toolproxy's recordings reached the disk budget ({size} of {self.max_bytes} bytes) and it was "
                "started with --on-disk-full block, so it refuses traffic it could not record; free space with "
                "`toolproxy prune`"
            ) if full else None
