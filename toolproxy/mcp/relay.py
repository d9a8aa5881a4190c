"""The stdio relay: an MCP server started as a child, every byte passed on both ways as it comes.

The agent starts `toolproxy mcp -- CMD ARGS` where its configuration named CMD: the agent's
stdin goes to the server's stdin and the server's stdout to the agent's stdout, byte for byte
and in order (each read is written on before it is looked at), and the server's stderr to the
wrapper's. One thread per direction: a read, a write, then the bytes are cut into lines and the
session (`session.StdioSession`) is told of each whole one, so recording costs the relay no
wait on anything but its own parsing; the segment writer is a thread of its own. The relay
waits only when the writer is behind (the proxy's backpressure, the same crash bound), and at
most the writer's stall timeout.

What a real server does reaches the agent as it would have: a server that crashes closes its
stdout (the agent reads EOF, then the wrapper exits with the server's status), one that hangs
sends nothing, one that writes a line that is no JSON-RPC message has it passed on (and
recorded as one). The wrapper passes SIGTERM, SIGINT and SIGHUP on to the server, and the
server gets SIGTERM if the wrapper dies (Linux), as if its own parent had stopped it.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from toolproxy.mcp.session import CLIENT, SERVER, Line, StdioSession
from toolproxy.record.model import now

READ_SIZE = 64 * 1024
STDERR_TAIL = 64 * 1024
# How long the server's pipes may stay open after it exited (a grandchild holding them: `npx`
# starts node) before the wrapper stops reading them.
DRAIN_SECONDS = 2.0


class LineCutter:
    """A byte stream cut into lines (each with its newline), with when each line's first and
    last byte came. A line past `limit` bytes keeps only its size (the relay passed it on whole)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.size = 0  # of the line being read (buf holds it unless it outgrew the limit)
        self.first = 0.0
        self.wall = 0.0

    def feed(self, data: bytes, t: float) -> list[Line]:
        out: list[Line] = []
        start = 0
        n = len(data)
        while start < n:
            if self.size == 0:
                self.first = t
            nl = data.find(b"\n", start)
            end = n if nl < 0 else nl + 1
            piece = data[start:end]
            self.size += len(piece)
            if self.size <= self.limit:
                self.buf += piece
            elif self.buf:
                self.buf.clear()
            if nl < 0:
                break
            raw = bytes(self.buf) if self.size <= self.limit else None
            out.append(Line(raw, self.size, now(), self.first, t))
            self.buf.clear()
            self.size = 0
            start = end
        return out

    def rest(self, t: float) -> Line | None:
        """The last line when the stream ended without its newline."""
        if not self.size:
            return None
        raw = bytes(self.buf) if self.size <= self.limit else None
        self.buf.clear()
        size, self.size = self.size, 0
        return Line(raw, size, now(), self.first, t)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Pump(threading.Thread):
    """One direction: read `src`, tell the session of each whole line, then write `dst`."""

    def __init__(
        self,
        name: str,
        src: int,
        dst: int | None,
        sender: str,
        session: StdioSession,
        limit: int,
        wait: Callable[[], None],
        on_dst_error: Callable[[OSError], None],
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.src, self.dst, self.sender = src, dst, sender
        self.session = session
        self.lines = LineCutter(limit)
        self.wait = wait
        self.on_dst_error = on_dst_error
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            self._pump()
        finally:
            self.ended.set()

    def _pump(self) -> None:
        src, lines, tell, sender = self.src, self.lines, self.session.message, self.sender
        while True:
            try:
                data = os.read(src, READ_SIZE)
            except OSError:
                data = b""
            t = time.perf_counter()
            if not data:
                last = lines.rest(t)
                if last is not None:
                    tell(sender, last)
                return
            self.wait()
            # Told before it is passed on: a server may answer a request before this thread runs
            # again, and an answer the session meets before its request pairs with nothing.
            for line in lines.feed(data, t):
                tell(sender, line)
            if self.dst is not None:
                try:
                    write_all(self.dst, data)
                except OSError as exc:  # the reader went away: keep reading, so what is sent is recorded
                    self.dst = None
                    self.on_dst_error(exc)


class StderrPump(threading.Thread):
    """The server's stderr passed on to ours, its last STDERR_TAIL bytes kept for the exit record."""

    def __init__(self, src: int, dst: int) -> None:
        super().__init__(name="toolproxy-mcp-stderr", daemon=True)
        self.src, self.dst = src, dst
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_size = 0

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.src, READ_SIZE)
            except OSError:
                return
            if not data:
                return
            if self.dst is not None:
                try:
                    write_all(self.dst, data)
                except OSError:
                    self.dst = None
            self.tail.append(data)
            self.tail_size += len(data)
            while self.tail_size - len(self.tail[0]) >= STDERR_TAIL:
                self.tail_size -= len(self.tail.popleft())

    def last(self) -> bytes:
        return b"".join(self.tail)[-STDERR_TAIL:]


def _die_with_parent() -> None:
    """In the server, before it runs: SIGTERM when the wrapper dies (Linux's PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class StdioRelay:
    """One server process behind the wrapper (module doc). `run()` returns the exit status to
    exit with: the server's (128+N for a signal), or 127/126 when it could not be started."""

    def __init__(
        self,
        argv: list[str],
        session: StdioSession,
        *,
        limit: int,
        shown_command: list[str],
        env: dict[str, str] | None = None,
        behind: Callable[[], bool] = lambda: False,
        stall_timeout: float = 30.0,
        client_in: int = 0,
        client_out: int = 1,
        errors: int = 2,
    ) -> None:
        self.argv = argv
        self.session = session
        self.limit = limit
        self.shown_command = shown_command
        self.env = env
        self.behind = behind
        self.stall_timeout = stall_timeout
        self.client_in, self.client_out, self.errors = client_in, client_out, errors
        self.proc: subprocess.Popen | None = None
        self.client_closed = threading.Event()  # the agent closed our stdin
        self.server_gone = threading.Event()  # a write to the server's stdin failed

    def _wait_for_writer(self) -> None:
        """The proxy's backpressure: while the writer is behind, what comes next waits (bounded)."""
        if not self.behind():
            return
        deadline = time.monotonic() + self.stall_timeout
        while self.behind() and time.monotonic() < deadline:
            time.sleep(0.002)

    def _say(self, text: str) -> None:
        try:
            os.write(self.errors, f"toolproxy mcp: {text}\n".encode("utf-8", "replace"))
        except OSError:
            pass

    def run(self) -> int:
        try:
            proc = self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env,
                bufsize=0,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            why = exc.strerror or str(exc)
            self.session.start(self.shown_command, None, f"cannot start {self.shown_command[0]}: {why}")
            self._say(f"cannot start the MCP server {self.shown_command[0]}: {why}")
            return 127 if isinstance(exc, FileNotFoundError) else 126
        self.session.start(self.shown_command, proc.pid)
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            previous[sig] = signal.signal(sig, self._pass_on)
        try:
            return self._relay(proc)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _pass_on(self, sig: int, frame) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(sig)
            except OSError:
                pass

    def _relay(self, proc: subprocess.Popen) -> int:
        to_server = proc.stdin.fileno()

        def server_unwritable(exc: OSError) -> None:
            self.server_gone.set()

        def client_unwritable(exc: OSError) -> None:
            pass  # the agent stopped reading: what the server sends is still recorded

        up = Pump(
            "toolproxy-mcp-up",
            self.client_in,
            to_server,
            CLIENT,
            self.session,
            self.limit,
            self._wait_for_writer,
            server_unwritable,
        )
        down = Pump(
            "toolproxy-mcp-down",
            proc.stdout.fileno(),
            self.client_out,
            SERVER,
            self.session,
            self.limit,
            self._wait_for_writer,
            client_unwritable,
        )
        err = StderrPump(proc.stderr.fileno(), self.errors)
        for thread in (up, down, err):
            thread.start()

        def close_server_stdin() -> None:
            up.ended.wait()
            self.client_closed.set()
            try:
                proc.stdin.close()  # the agent hung up: the server reads EOF, as it would have
            except OSError:
                pass

        threading.Thread(target=close_server_stdin, name="toolproxy-mcp-eof", daemon=True).start()
        while True:
            try:
                code = proc.wait()
                break
            except InterruptedError:
                continue
        down.ended.wait(DRAIN_SECONDS)
        err.join(DRAIN_SECONDS)
        client_first = self.client_closed.is_set()
        if client_first:
            self.session.close("client_closed", "the client closed its end of the session before an answer")
        else:
            self.session.close("server_exited", f"the server exited ({_status(code)}) before answering")
        self.session.exit(
            code,
            err.last(),
            client_first=client_first,
            message=f"the server exited ({_status(code)}) while its client was still connected",
        )
        return code if code >= 0 else 128 - code


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"
