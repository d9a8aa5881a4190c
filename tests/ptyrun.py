"""Run a CLI command with its stderr on a pseudo-terminal, as a user at a terminal sees it.

Progress lines are drawn only when stderr is a terminal: tests of them need one. stdout stays a
pipe, so a test also sees that results never carry the redrawn line.
"""

from __future__ import annotations

import fcntl
import os
import pty
import subprocess
import termios

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
    what a user sees *before* the command ends (a header at once, each check as it completes).

    controlling=True makes the terminal the command's controlling terminal, as a shell does (a
    session of its own, stdin on it too): `interrupt()` then types Ctrl-C, and the terminal sends
    SIGINT to the whole foreground process group, the command and its children alike."""

    def __init__(self, cmd: list[str], env: dict | None = None, controlling: bool = False) -> None:
        leader, follower = pty.openpty()
        self._leader = leader

        def take_terminal() -> None:  # in the child, before exec: a new session whose terminal this is
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=follower,
                stderr=follower,
                stdin=follower if controlling else subprocess.DEVNULL,
                env=env,
                preexec_fn=take_terminal if controlling else None,
            )
        finally:
            os.close(follower)
        self.seen = bytearray()

    def interrupt(self) -> None:
        """Ctrl-C typed at the terminal (its line discipline turns it into SIGINT)."""
        os.write(self._leader, b"\x03")

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
