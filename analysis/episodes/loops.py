"""Episodes that loop: the same call over and over, or far more turns than the run's others."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from toolproxy.analysis.episodes.model import Episode

# An episode is flagged as looping when the same call (name + arguments) repeats in this many
# consecutive turns, or when it has at least LOOP_MIN_TURNS turns and LOOP_MEDIAN_FACTOR times
# the run's median turn count.
LOOP_REPEATS = 3
LOOP_MEDIAN_FACTOR = 3.0
LOOP_MIN_TURNS = 10


def mark_loops(episodes: list[Episode]) -> None:
    if not episodes:
        return
    median = statistics.median(len(ep.turns) for ep in episodes)
    for ep in episodes:
        ep.loop_reason = loop_reason([t.attempts[-1].call_signature for t in ep.turns], median)
        ep.looping = ep.loop_reason is not None


def loop_reason(signatures: Sequence[str | None], run_median: float) -> str | None:
    """Why an episode counts as looping, or None. See LOOP_* for the thresholds."""
    return _streak_reason(signatures) or _length_reason(len(signatures), run_median)


def rejudged(reason: str | None, n_turns: int, run_median: float) -> str | None:
    """An episode's loop reason once its run's median turn count moved (other episodes were added
    or re-derived): a streak of identical calls is the episode's own and stays, the length rule
    is applied again."""
    if reason is not None and reason.endswith(_STREAK):
        return reason
    return _length_reason(n_turns, run_median)


_STREAK = " identical consecutive calls"


def _streak_reason(signatures: Sequence[str | None]) -> str | None:
    best = streak = 0
    prev = None
    for sig in signatures:
        streak = streak + 1 if sig is not None and sig == prev else 1
        prev = sig
        if sig is not None:
            best = max(best, streak)
    return f"{best}{_STREAK}" if best >= LOOP_REPEATS else None


def _length_reason(n: int, run_median: float) -> str | None:
    if n >= LOOP_MIN_TURNS and n >= LOOP_MEDIAN_FACTOR * run_median:
        return f"{n} turns, run median {run_median:g}"
    return None
