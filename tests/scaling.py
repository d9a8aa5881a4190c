"""Timing checks that hold on a loaded machine: compare a run on N units with a run on N/8 in the
same process, instead of an absolute seconds bound that a busy shared machine can break.

Linear work takes ~8x as long on 8x the input (less with fixed costs, a little more with cache
effects on large inputs), quadratic ~64x. Load only ever adds time, so the best timing seen of
each size is the truest; a few more rounds are measured before failing, so a burst of load during
one measurement is not a failure, while a real quadratic fails every round.

A ratio alone passes work that is linear but far too slow, so the big input is also held against
a reference timed beside it (a fixed loop of plain Python steps, REFERENCE): a budget in
reference units slows down with the machine, where a budget in seconds fails under load.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

FACTOR = 8
MAX_RATIO = FACTOR**2 / 2  # half of what quadratic work would take; 4x linear
# Below this the big input is fast whatever the ratio: work the small input skips almost entirely
# (a scan for a marker that is not there) can show any ratio, and quadratic work on the inputs
# these tests use takes seconds.
FAST_ENOUGH = 0.02


REFERENCE_STEPS = 1_000_000


def reference() -> int:
    """The unit of the speed budget: a million additions in a Python loop, which a loaded core
    slows as much as the work it is compared with."""
    total = 0
    for step in range(REFERENCE_STEPS):
        total += step
    return total


def best_time(run: Callable[[], object], at_least: float = 0.05) -> float:
    """Seconds per call, over enough calls to take `at_least` seconds: a millisecond-long call
    timed once is mostly scheduler noise."""
    calls, spent = 0, 0.0
    while spent < at_least:
        started = time.perf_counter()
        run()
        spent += time.perf_counter() - started
        calls += 1
    return spent / calls


def assert_scales_linearly(
    small: Callable[[], object], big: Callable[[], object], what: str, max_references: float, rounds: int = 4
) -> float:
    """small() does 1/FACTOR of big()'s work, and big()'s best time must also stay within
    max_references runs of reference() timed in the same rounds. Returns the accepted
    best-big / best-small ratio."""
    # What earlier tests left alive in this process is no part of the code under test, but every
    # full collection while big() allocates would scan it too: a test worker's heap made 8x the
    # deltas take 32x as long where a fresh process takes 12x. Frozen, the collector skips it.
    gc.collect()
    gc.freeze()
    try:
        return _linear_ratio(small, big, what, max_references, rounds)
    finally:
        gc.unfreeze()


def _linear_ratio(
    small: Callable[[], object], big: Callable[[], object], what: str, max_references: float, rounds: int
) -> float:
    best_small = best_big = best_reference = float("inf")
    for _ in range(rounds):
        best_reference = min(best_reference, best_time(reference))
        best_small = min(best_small, best_time(small), best_time(small))
        best_big = min(best_big, best_time(big))
        ratio = best_big / max(best_small, 1e-6)
        if ratio < MAX_RATIO or best_big < FAST_ENOUGH:
            budget = best_big / best_reference
            if budget < max_references:
                return ratio
    if ratio < MAX_RATIO or best_big < FAST_ENOUGH:
        raise AssertionError(
            f"{what}: the full input took {best_big:.2f}s, {budget:.0f} times a reference loop timed beside it "
            f"(at most {max_references:g}); best of {rounds} rounds"
        )
    raise AssertionError(
        f"{what}: {FACTOR}x the input took {ratio:.1f}x as long, best of {rounds} rounds "
        f"({best_big:.3f}s vs {best_small:.4f}s; linear is ~{FACTOR}, quadratic ~{FACTOR**2})"
    )
