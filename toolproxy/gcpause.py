"""Cyclic garbage collection paused around work that builds many small containers.

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
