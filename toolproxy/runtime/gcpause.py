"""Cyclic garbage collection paused around work that builds many small containers, and tuned for serving.

The parser, the per-record analysis and turn derivation each allocate hundreds of thousands of
tuples, dataclasses and dicts that never form cycles. With the collector running, its
generation-2 passes walk everything alive again and again as that heap grows: on a 1 MB text of
repeated call markers they were half the parse time and made it grow faster than the input.
Reference counting still frees everything as usual; only the cycle search waits.

Safe across threads: a pause only re-enables what it found enabled, so overlapping pauses end
with the collector on, and a program that turned it off itself keeps it off.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# The young generation's threshold while serving. At CPython's 700, the proxy's in-flight requests
# alone (coroutines, futures, headers, records: freed by reference counting as each ends) push
# the count past it every few requests, and each pass walks what is alive: a tenth of the CPU a
# request costs, measured (benchmarks.proxy --profile). Objects that only the collector frees are
# a few per request, so passes become rare and hold a few MB of garbage at most.
SERVING_YOUNG_THRESHOLD = 20_000


def settle_for_serving() -> None:
    """Before a proxy serves: what startup built (modules, the app, its addons) is moved out of
    the collector's sight (gc.freeze: it lives as long as the process), so full passes walk only
    what serving made since, and the young generation is collected less often."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young:  # 0: the collector was switched off on purpose; leave it so
        gc.set_threshold(max(young, SERVING_YOUNG_THRESHOLD), middle, old)
