"""Run a CLI command with its stderr on a pseudo-terminal, as a user at a terminal sees it.

Progress lines are drawn only when stderr is a terminal: tests of them need one. stdout stays a
pipe, so a test also sees that results never carry the redrawn line.
"""

from __future__ import annotations

import os
import pty
import subprocess

REDRAW = b"\r\x1b[2K"  # how every progress line starts: back to column 0, erase the line


def on_a_terminal(cmd: list[str], env: dict | None = None, timeout: float = 180) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, everything written to the terminal)."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL, env=env)
        os.close(follower)
        follower = -1
        seen = bytearray()
        while True:  # drained while it runs: a full pty buffer would block the command
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        out = proc.stdout.read()
        proc.wait(timeout)
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    return proc.returncode, out, bytes(seen)
