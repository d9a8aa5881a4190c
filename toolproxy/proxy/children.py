"""The proxy's helper processes (the live view's classifier, the OTLP exporter): started so that a
Ctrl-C to the whole process group never prints a traceback from one of them."""

from __future__ import annotations

import signal
import threading
from multiprocessing.process import BaseProcess


def start_child(proc: BaseProcess) -> None:
    """Start `proc` with SIGINT ignored, which the new interpreter inherits from its first
    instruction: a Ctrl-C sent to the group while it is still importing would otherwise print a
    traceback before its own code could ignore it. The proxy stops its children itself."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
    try:
        proc.start()
    finally:
        if in_main:
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
