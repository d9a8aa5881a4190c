"""The proxy's helper processes (the live view's classifier, the OTLP exporter): started so that a
Ctrl-C to the whole process group never prints a traceback from one of them."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from multiprocessing.process import BaseProcess


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while a child starts, which the new interpreter inherits (across exec too)
    from its first instruction: a Ctrl-C sent to the group while it is still importing would
    otherwise print a traceback before its own code could ignore it. The proxy stops its
    children itself."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
    try:
        yield
    finally:
        if in_main:
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


def start_child(proc: BaseProcess) -> None:
    """Start a multiprocessing child with SIGINT ignored (see sigint_ignored)."""
    with sigint_ignored():
        proc.start()
