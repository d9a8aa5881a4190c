"""`toolproxy serve` as a child process, for tests that start their own (module-scoped) proxies.

Kept out of conftest.py: tests/analysis has a conftest of its own, so `from conftest import` is
ambiguous when the whole suite runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from toolproxy.record.segments import read_records

LISTENING = re.compile(r"listening on (http://\S+?)(?:\s|$)")


class ProxyProcess:
    """`toolproxy serve` running as a child process; output is drained so it never blocks."""

    def __init__(
        self,
        upstream: str,
        data: Path,
        args: tuple[str, ...] = (),
        env: dict | None = None,
        startup_timeout: float = 20.0,
        command: tuple[str, ...] | None = None,
    ) -> None:
        """`command`: another toolproxy command that listens (`mcp --upstream URL`, `playback
        --from RUN`) in place of `serve --upstream upstream`, with the same --port 0 and --data."""
        self.data = data
        self.args = args
        self.upstream = upstream
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        cmd = [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            *(command or ("serve", "--upstream", upstream)),
            "--port",
            "0",
            "--data",
            str(data),
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )
        self._found = threading.Event()
        self.url: str | None = None
        threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout, True), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr, False), daemon=True).start()
        deadline = time.monotonic() + startup_timeout
        while not self._found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"toolproxy serve did not start (rc={self.proc.returncode}):\n{self.output()}")
        self.wait_healthy(deadline - time.monotonic())

    def _drain(self, stream, sink: list[str], watch: bool) -> None:
        for line in stream:
            sink.append(line)
            if watch and not self._found.is_set():
                m = LISTENING.search(line)
                if m:
                    self.url = m.group(1).rstrip(";,")
                    self._found.set()

    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def health(self) -> tuple[int, dict]:
        import json

        try:
            with urllib.request.urlopen(self.url + "/_toolproxy/health", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stats(self) -> dict:
        import json

        with urllib.request.urlopen(self.url + "/_toolproxy/stats", timeout=5) as r:
            return json.loads(r.read())

    def wait_healthy(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + max(timeout, 1.0)
        while True:
            try:
                self.health()
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"toolproxy never answered its health check:\n{self.output()}") from None
                time.sleep(0.05)

    def records(self) -> list[dict]:
        return read_records(self.data, "exchange")

    def wait_records(self, n: int, timeout: float = 5.0, run: str | None = None) -> list[dict]:
        """Records are written by a background thread: poll until at least n (of `run`, if given)
        are on disk."""
        deadline = time.monotonic() + timeout
        while True:
            recs = self.records()
            if run is not None:
                recs = [r for r in recs if r.get("run") == run]
            if len(recs) >= n or time.monotonic() > deadline:
                return recs
            time.sleep(0.02)

    def wait_written(self, n: int, timeout: float = 5.0) -> dict:
        """Stats once `written` (records covered by an fsync: in group mode up to a commit window
        after they are visible on disk) reaches n, or at the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if stats["recording"]["written"] >= n or time.monotonic() > deadline:
                return stats
            time.sleep(0.02)

    def terminate(self) -> None:
        """SIGTERM (graceful: flushes records) without waiting; stop() waits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (graceful: flushes records) and wait."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no flush, no cleanup, as a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def start_all(upstream: str, runs: dict[str, tuple[Path, tuple[str, ...]]]) -> dict[str, ProxyProcess]:
    """Several proxies in front of one upstream, {name: (data dir, serve args)}, started side by
    side: each one's start-up (imports, its live view's classifier process) overlaps the others'."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(ProxyProcess, upstream, *spec) for name, spec in runs.items()}
    started = {name: f.result() for name, f in futures.items() if f.exception() is None}
    if len(started) < len(futures):  # none is left running when one did not start
        stop_all(started.values())
        next(f for f in futures.values() if f.exception() is not None).result()
    return started


def stop_all(proxies) -> None:
    """Stop proxies side by side: all are told first, then each is waited for (a graceful stop is
    mostly waiting: the writer's last fsync, the live view's classifier winding down)."""
    proxies = list(proxies)
    for p in proxies:
        p.terminate()
    for p in proxies:
        p.stop()


_stopping: list[threading.Thread] = []


_stop_failures: list[str] = []


def stop_in_background(proxies) -> None:
    """Tell proxies to stop and let them finish while the next test runs: a graceful stop is
    mostly waiting (the last fsync, the live view's classifier process winding down), and nothing
    after a test's teardown needs its proxy gone. wait_stopped() waits for them all (at the end
    of the session) and fails if any could not be stopped; a proxy that hangs is killed by stop()
    there as anywhere, and one that fails to stop does not keep the others from stopping."""
    proxies = list(proxies)
    for p in proxies:
        p.terminate()

    def stop_each() -> None:
        for p in proxies:
            try:
                p.stop()
            except Exception as exc:  # noqa: BLE001 - reported by wait_stopped, after the rest are stopped
                _stop_failures.append(f"{p.url}: {type(exc).__name__}: {exc}")

    if proxies:
        t = threading.Thread(target=stop_each, name="proxy-stop", daemon=True)
        t.start()
        _stopping.append(t)


def wait_stopped() -> None:
    while _stopping:
        _stopping.pop().join()
    if _stop_failures:
        raise RuntimeError("proxies that could not be stopped: " + "; ".join(_stop_failures))


def toolproxy_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`toolproxy ARGS...` as a subprocess, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


T = TypeVar("T")


def together(*calls: Callable[[], T]) -> list[T]:
    """Run independent calls (CLI subprocesses that only read, or each in its own data dir) at the
    same time and return their results in order: a CLI run is mostly its own start-up CPU, so on a
    two-core machine runs that overlap take about half the wall time of runs in a row. Every call
    that fails is reported: one failure as itself, several as one group."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        failed = [exc for exc in (f.exception() for f in futures) if exc is not None]
    if len(failed) == 1:
        raise failed[0]
    if failed:
        raise BaseExceptionGroup(f"{len(failed)} of {len(calls)} side-by-side calls failed", failed)
    return [f.result() for f in futures]


def sql_rows(data: Path, query: str) -> list[dict]:
    """`toolproxy sql --format json` on an analysed data directory."""
    r = toolproxy_cli("sql", "--data", str(data), "--format", "json", query)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)
