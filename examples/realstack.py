"""Start a real llama.cpp server and a toolproxy in front of it.

Where the server and its models are expected: docs/stacks.md#a-real-llamacpp-for-the-real-stack-scripts.

Shared by the real-stack check scripts in this folder (not by CI: the server takes ~10 minutes
to build once per machine).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REALSTACK = Path(os.environ.get("TOOLPROXY_REALSTACK", Path.home() / ".cache" / "toolproxy-realstack"))
MODELS = {"qwen": "qwen2.5-coder-0.5b.gguf", "gemma": "gemma-3-270m-q4_k_m.gguf"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {url} came up")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer 200 within {timeout}s")


@contextlib.contextmanager
def llama_server(model: str = "qwen", *extra: str):
    """Yields the server's base URL; stops it on exit."""
    binary = REALSTACK / "bin" / "llama-server"
    gguf = REALSTACK / "models" / MODELS[model]
    if not binary.exists() or not gguf.exists():
        sys.exit(f"real stack missing under {REALSTACK}: see docs/stacks.md#a-real-llamacpp-for-the-real-stack-scripts")
    port = free_port()
    log = open(tempfile.mktemp(prefix="llama-server-", suffix=".log"), "w")
    proc = subprocess.Popen(
        [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-t", "2", *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "LD_LIBRARY_PATH": str(REALSTACK / "bin")},
    )
    try:
        _wait(f"http://127.0.0.1:{port}/health", 180, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@contextlib.contextmanager
def proxy(upstream: str, data_dir: Path, *extra: str):
    """Yields the proxy's base URL (the real `toolproxy serve` as a subprocess)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "serve",
            "--upstream",
            upstream,
            "--port",
            "0",
            "--data",
            str(data_dir),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://\S+)", line)
        if not m:
            raise RuntimeError(f"toolproxy did not start: {line}{proc.stdout.read()}")
        yield m.group(1)
    finally:
        proc.terminate()
        proc.wait(30)
