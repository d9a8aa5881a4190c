"""Running a command whose stderr is a terminal (a pty), as a user's shell does, to see what it draws there."""

from __future__ import annotations

import os
import pty
import subprocess


def run_with_terminal_stderr(cmd: list[str], timeout: float = 120) -> tuple[subprocess.CompletedProcess, bytes]:
    """(the finished process with stdout captured, every byte it wrote to the terminal)."""
    leader, follower = pty.openpty()
    try:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=follower, timeout=timeout)
        finally:
            os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the other end is closed and everything read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    return proc, shown
