"""MCP servers and toolproxy commands as child processes, for the MCP tests."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from proxyprocess import ProxyProcess

from toolproxy.record.segments import read_records

HERE = Path(__file__).resolve().parent
SERVER = [sys.executable, str(HERE / "mcpserver.py")]
CLIENT = [sys.executable, str(HERE / "mcpclient.py")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def http_server(*options: str) -> Iterator[str]:
    """tests/mcpserver.py over Streamable HTTP ("stateless", "json") or "sse"; its root URL."""
    port = free_port()
    mode = "sse" if "sse" in options else "http"
    proc = subprocess.Popen([*SERVER, mode, str(port), *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the MCP test server did not start (rc={proc.returncode})") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def mcp_proxy(upstream: str, data: Path, *args: str) -> ProxyProcess:
    """`toolproxy mcp --upstream URL` as a child process (stop() flushes its records)."""
    return ProxyProcess(upstream, data, args, command=("mcp", "--upstream", upstream))


def playback(data: Path, run: str, *args: str) -> ProxyProcess:
    """`toolproxy playback --from RUN` as a child process."""
    return ProxyProcess("", data, args, command=("playback", "--from", run))


def client(
    mode: str, calls: list, *, url: str | None = None, sse: str | None = None, server: list[str] | None = None, env=None
) -> list[dict]:
    """tests/mcpclient.py's lines: the client's own record of what it got."""
    where = ["--url", url] if url is not None else ["--sse", sse] if sse is not None else ["--", *server]
    done = subprocess.run(
        [*CLIENT, mode, json.dumps(calls), *where], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def mcp_records(data: Path) -> list[dict]:
    return [r for r in read_records(data) if r.get("kind") == "mcp"]
