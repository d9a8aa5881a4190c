"""`serve --retain` and `serve --max-disk`: retention and a disk budget, on a thread of their own.

Listing, stat'ing and deleting segments is disk work, so it never runs on the event loop: a
daemon thread looks every `interval` seconds. Deleting goes through record/retention.py, so a
segment the writer has open is never touched and every deletion is in the prune ledger for the
analyzer. Over budget, the oldest closed segments go first (`prune`), or (`block`) nothing is
deleted and the proxy answers 503 until an operator makes room: the refusals are counted (and
recorded only within the refusal budget, in segments of their own, proxy/refusals.py), the
exchanges they stand for were never forwarded, so nothing is lost uncounted either way. The
budget governs the exchanges' segments: refused requests' segments have a small cap of their
own, so a flood of them can neither prune a real record away nor make the proxy refuse.

In `block` mode the budget is enforced before each write, not by the scan alone: the writer
asks `check` before it appends and reports every byte it appends (`appended`), so the proxy
starts refusing at the append that reaches the budget. What is already past admission (the
exchanges in flight then) is still recorded, up to `slack` bytes past the budget (a segment's
size); an append beyond that is refused and its records dropped and counted (`disk_budget`).
The scan (every quarter second) adds what other processes wrote and sees what an operator freed:
with several workers, each also counts its peers' appends only at its next scan.

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
from toolproxy.record.writer import OverBudget


@dataclass
class HousekeepingStats:
    pruned_segments: int = 0
    pruned_bytes: int = 0
    last_error: str | None = None


class Housekeeper:
    def __init__(
        self,
        data_dir: str | Path,
        *,
        retain: float | None,
        max_bytes: int | None,
        on_full: str = "prune",
        headroom: int = 0,
        interval: float | None = None,
        slack: int = 0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.retain = retain
        self.max_bytes = max_bytes
        self.on_full = on_full
        self.headroom = headroom
        self.slack = slack
        # Bytes this process's writer appended (writer thread), and (segment bytes the last scan
        # found, that count when the scan began): their difference since is what the scan missed.
        self._appended = 0
        self._scanned = (0, 0)
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
        return {
            "retain_s": self.retain,
            "max_disk_bytes": self.max_bytes,
            "on_disk_full": self.on_full,
            "segment_bytes": self._used(),
            "pruned_segments": s.pruned_segments,
            "pruned_bytes": s.pruned_bytes,
            "refusing": self.refusal is not None,
            "last_error": s.last_error,
        }

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
                self._prune(None, self.max_bytes - self.headroom, "disk budget", refusals=False)
            else:
                self._check_budget()
        except OSError as exc:
            self.stats.last_error = f"making room in {self.data_dir}: {exc}"

    def _prune(self, older_than: float | None, max_bytes: int | None, why: str, refusals: bool | None = None) -> None:
        with self._pruning:
            result = prune(
                self.data_dir, older_than=older_than, max_bytes=max_bytes, now=time.time(), refusals=refusals
            )
            self.stats.pruned_segments += len(result.pruned)
            self.stats.pruned_bytes += result.bytes
        if result.pruned:
            print(
                f"toolproxy: pruned {len(result.pruned)} segments ({result.bytes / 1e6:.1f} MB): {why}",
                file=sys.stderr,
                flush=True,
            )

    def tick(self) -> None:
        if self.retain is not None:
            self._prune(self.retain, None, "retention")
        self._check_budget()

    def check(self, n: int) -> None:
        """Before the writer appends `n` bytes (its thread): OverBudget if they would take the
        segments more than `slack` past the budget."""
        used = self._used() + n
        if used > self.max_bytes + self.slack:
            self._set_full(used)
            raise OverBudget(
                f"not written: {n} bytes would take the recordings to {used} bytes, past the disk budget of "
                f"{self.max_bytes} (--max-disk, --on-disk-full block) by more than {self.slack}"
            )

    def appended(self, n: int) -> None:
        """The writer appended (or, negative, cut back) `n` bytes; refusing starts at the budget."""
        self._appended += n
        if n > 0 and self.refusal is None:
            used = self._used()
            if used >= self.max_bytes:
                self._set_full(used)

    def _used(self) -> int:
        scanned, mark = self._scanned
        return scanned + self._appended - mark

    def _check_budget(self) -> None:
        # Read before the scan: an append made meanwhile is counted twice until the next scan
        # (an overestimate), never missed.
        mark = self._appended
        size = data_dir_bytes(self.data_dir, refusals=False)
        self._scanned = (size, mark)
        if self.max_bytes is not None and self.on_full == "block":
            used = self._used()
            if used >= self.max_bytes:
                self._set_full(used)
            elif self.refusal is not None:
                print("toolproxy: back under the disk budget; serving again", file=sys.stderr, flush=True)
                self.refusal = None

    def _set_full(self, used: int) -> None:
        if self.refusal is None:
            print(
                f"toolproxy: disk budget reached ({used} of {self.max_bytes} bytes); refusing new requests "
                "with 503 until segments are pruned",
                file=sys.stderr,
                flush=True,
            )
        self.refusal = (
            f"toolproxy's recordings reached the disk budget ({used} of {self.max_bytes} bytes) and it was "
            "started with --on-disk-full block, so it refuses traffic it could not record; free space with "
            "`toolproxy prune`"
        )
