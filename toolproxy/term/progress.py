"""One progress line for every command that can run for minutes (analyze, conformance, ...).

Written to stderr and redrawn in place (carriage return), at most a few times a second, so a
slow command says how far it is, how fast it goes and how long it has left. It stays silent when
stderr is not a terminal (piped into a file or CI log, where redrawn lines are noise) or when the
command was given --quiet; the command's own results go to stdout either way.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def duration(seconds: float) -> str:
    """12s, 3m05s, 2h10m: short enough for one line."""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def line(label: str, done: float, total: float | None, elapsed: float, unit: str = "", scale: float = 1.0) -> str:
    """The text of one progress line; pure, so its wording is tested with a table of cases.

    `scale` divides the counts for display (bytes shown as MB, say) without changing the rate's
    meaning: the rate is per second of `unit`, or per minute when whole units come slower than
    one a second.
    """
    shown = done / scale
    rate = shown / elapsed if elapsed > 0 else 0.0
    fmt = (lambda v: f"{v:,.1f}") if scale != 1.0 else (lambda v: f"{v:,.0f}")
    unit_s = f" {unit}" if unit else ""
    if total:
        pct = min(100.0, 100.0 * done / total)
        text = f"{label}: {fmt(shown)}/{fmt(total / scale)}{unit_s} ({pct:.0f}%)"
    else:
        text = f"{label}: {fmt(shown)}{unit_s}"
    if scale == 1.0 and 0 < rate < 1:  # a CPU model's requests: "0 requests/s" would say nothing
        text += f", {rate * 60:,.1f}{unit_s}/min"
    else:
        text += f", {fmt(rate)}{unit_s}/s"
    if total and done and elapsed > 0 and done < total:
        text += f", {duration((total - done) / (done / elapsed))} left"
    elif total and done >= total:
        text += f", done in {duration(elapsed)}"
    return text


class Progress:
    """Counts toward an optional total and redraws its line on `stream` when that is a terminal."""

    def __init__(
        self,
        label: str,
        total: float | None = None,
        *,
        unit: str = "",
        scale: float = 1.0,
        quiet: bool = False,
        stream: TextIO | None = None,
        interval: float = 0.25,
    ) -> None:
        self.label, self.total, self.unit, self.scale = label, total, unit, scale
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = not quiet and bool(isatty and isatty())
        self.interval = interval
        self.done = 0.0
        self.started = time.monotonic()
        self._drawn = 0.0
        self._shown = False

    def advance(self, n: float = 1) -> None:
        self.done += n
        self._maybe_draw()

    def update(self, done: float) -> None:
        self.done = done
        self._maybe_draw()

    def _maybe_draw(self) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn >= self.interval:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        self.show(line(self.label, self.done, self.total, now - self.started, self.unit, self.scale))

    def show(self, text: str) -> None:
        """Replace the line with `text` (for commands whose progress is not one count)."""
        if not self.enabled:
            return
        try:
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()
            self._shown = True
        except (OSError, ValueError):  # a closed terminal must not cost the command its work
            self.enabled = False

    def clear(self) -> None:
        """Erase the line (before printing something else on stderr)."""
        if self._shown and self.enabled:
            self.show("")
            self._shown = False

    def close(self) -> None:
        """Draw the final state and end the line, so what follows starts on a fresh one (nothing
        when nothing was counted or shown: a phase that had no work leaves no line)."""
        if self.enabled and (self._shown or self.done):
            self._draw(time.monotonic())
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
        self.enabled = False

    def then(self, label: str, total: float | None = None, *, unit: str = "", scale: float = 1.0) -> Progress:
        """End this line and start the next phase's, on the same stream and as quiet (a command
        whose long work has several parts: reading, then deriving)."""
        self.close()
        return Progress(
            label, total, unit=unit, scale=scale, quiet=self.quiet, stream=self.stream, interval=self.interval
        )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
