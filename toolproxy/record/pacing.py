"""When each piece of a response arrived, kept small enough to ride in every streamed record.

`toolproxy playback --pace recorded` sends a recorded stream again with the gaps the upstream
left between its events: a harness whose timeouts, progress output or cancellation depend on
them sees the same rhythm. The body is stored whole, so what is kept is where each piece ended
(a byte offset into the body) and when (milliseconds since the exchange started, the clock
`ttfb_ms` is on). A long stream would make that list as long as the stream; past `MAX_MARKS`
every second mark is dropped, which halves the resolution but keeps the marks that stay exact,
so a record never holds more than `MAX_MARKS` pairs (under 2 KB) however long its stream ran.
A reply that came in one piece keeps no marks (`extra` is unchanged for it).
"""

from __future__ import annotations

import time

MAX_MARKS = 128
# Where the marks go in the record's `extra`: [[end offset, ms], ...] in arrival order.
EXTRA_KEY = "piece_ms"


class PieceTimes:
    __slots__ = ("t0", "size", "marks", "step", "_skipped")

    def __init__(self, t0: float) -> None:
        self.t0 = t0  # time.perf_counter() at the exchange's start
        self.size = 0
        self.marks: list[list[float]] = []
        self.step = 1  # keep one piece's end in `step` (doubles each time the list fills)
        self._skipped = 0

    def add(self, n: int) -> None:
        self.size += n
        self._skipped += 1
        if self._skipped < self.step:
            return
        self._skipped = 0
        self.marks.append([self.size, round((time.perf_counter() - self.t0) * 1000.0, 1)])
        if len(self.marks) >= MAX_MARKS:
            del self.marks[::2]
            self.step *= 2

    def final(self) -> list[list[float]] | None:
        """The marks to store, the body's end included; None for a body that came in one piece."""
        if not self.marks and not self._skipped:
            return None
        if self._skipped:
            self.marks.append([self.size, round((time.perf_counter() - self.t0) * 1000.0, 1)])
            self._skipped = 0
        return self.marks if len(self.marks) > 1 else None


def read_marks(value: object) -> list[tuple[int, float]]:
    """Stored marks (`extra[EXTRA_KEY]`) as (end offset, ms) pairs; ValueError saying what is
    wrong when they are not [[offset, ms], ...] with whole offsets and finite times, both >= 0."""
    if not isinstance(value, list):
        raise ValueError(f"piece marks are {type(value).__name__}, not a list of [offset, ms] pairs")
    out = []
    for mark in value:
        if (
            not isinstance(mark, list)
            or len(mark) != 2
            or type(mark[0]) is not int
            or type(mark[1]) not in (int, float)
            or mark[0] < 0
            or not 0 <= mark[1] < float("inf")
        ):
            raise ValueError(f"piece mark {str(mark)[:40]} is not [offset, ms] with a whole offset and a time >= 0")
        out.append((mark[0], float(mark[1])))
    return out
