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


class Terminal:
    """A command with stdout and stderr both on one pseudo-terminal, read while it runs: a test of
    what a user sees *before* the command ends (a header at once, each check as it completes)."""

    def __init__(self, cmd: list[str], env: dict | None = None) -> None:
        leader, follower = pty.openpty()
        self._leader = leader
        try:
            self.proc = subprocess.Popen(cmd, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=env)
        finally:
            os.close(follower)
        self.seen = bytearray()

    def wait_for(self, text: bytes, timeout: float) -> bool:
        """Read until `text` has been shown (True) or `timeout` seconds pass or the command ends (False)."""
        import select
        import time

        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._leader], [], [], left)[0]:
                return False
            try:
                chunk = os.read(self._leader, 65536)
            except OSError:  # EIO: the command closed the terminal
                return False
            if not chunk:
                return False
            self.seen += chunk
        return True

    def finish(self, timeout: float = 120) -> int:
        """Read to the end and wait for the exit code."""
        try:
            self.wait_for(b"\0never shown\0", timeout)
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self._leader)
