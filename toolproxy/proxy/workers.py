"""`serve --workers N`: N proxy processes on one port, supervised by the process the user started.

One Python process forwards on one core. To use more, the supervisor starts N worker processes
that each bind the same address with SO_REUSEPORT, so the kernel spreads new connections across
them with no process in the data path. Each worker is the ordinary single-process proxy: its
own event loop, upstream pool and writer thread. Writers never share a file: segment names carry
the writing process's id, and `analyze` reads every segment in the directory.

Stats and health have to answer for all workers, whichever one the kernel hands the admin
request to. Each worker publishes its snapshot a few times a second as a small JSON file in a
private directory (tmpfs when there is one); the admin handler reads its peers' files off the
loop and merges them with its own live numbers (toolproxy.proxy.groupstats). Files rather than
shared memory because the snapshot is a nested dict whose fields grow with the proxy, a file is
atomic with a rename, and a crashed worker's last numbers stay readable: the supervisor renames
them to `retired-*` so counters never go backwards after a restart. A worker that stops
gracefully publishes once more after its writer has closed, marked `final`.

The supervisor does nothing but start, watch and stop: SIGINT or SIGTERM stops every worker
gracefully (each flushes its records), a worker that dies is reported on stderr and restarted
with a growing back-off, and a worker that cannot start at all (say, the port is taken) stops
the whole group with its error instead of restarting forever.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.groupstats import group_snapshot, read_peers

PUBLISH_EVERY = 0.25
STOP_GRACE = 20.0  # below systemd's usual TimeoutStopSec; a worker's writer drains within 10 s


def raise_fd_limit() -> int:
    """Lift this process's soft limit on open files to the hard one; the limit now in force.

    Every stream holds two sockets (client and upstream), and many systems start processes with
    a soft limit of 1024: without this, a proxy in front of a busy fleet fails at ~500 streams.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
    return hard


# ---- in each worker ----------------------------------------------------------------------------


@dataclass
class Worker:
    """What a worker process knows about its group; attached to its app's state."""

    index: int
    peers_dir: Path
    pid: int = field(default_factory=os.getpid)
    _task: asyncio.Task | None = None

    @property
    def path(self) -> Path:
        return self.peers_dir / f"worker-{self.pid}.json"

    def stamped(self, snapshot: dict, final: bool = False) -> dict:
        worker = {"index": self.index, "pid": self.pid, "published_at": time.time()}
        if final:
            worker["final"] = True
        return {**snapshot, "worker": worker}

    def publish(self, snapshot: dict, final: bool = False) -> None:
        """Write this worker's numbers for its peers (blocking: run off the loop); `final` once its
        writer has closed, so nothing it did is missing from them."""
        snapshot = self.stamped(snapshot, final)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(snapshot))
        os.replace(tmp, self.path)

    def attach(self, app) -> None:
        """Join the group: merged stats for this app's admin routes, a last publish at cleanup
        (after the writer closed, so a stopped worker's final counts are on file), and a socket
        for its live view's classifier, where its peers' page handlers ask for its share."""
        from toolproxy.proxy.state import STATE

        state = app[STATE]
        state.peers = self
        if state.live is not None:
            state.live.socket_path = self.live_socket(self.pid)

        async def on_cleanup(app) -> None:
            if self._task is not None:
                self._task.cancel()
            await asyncio.get_running_loop().run_in_executor(None, self.publish, state.snapshot(), True)

        app.on_cleanup.append(on_cleanup)

    async def listening(self, state) -> None:
        """Called once the port is bound: the first snapshot is the supervisor's sign of readiness."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.publish, state.snapshot())
        self._task = loop.create_task(self._publish_forever(state))

    async def _publish_forever(self, state) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PUBLISH_EVERY)
            try:
                await loop.run_in_executor(None, self.publish, state.snapshot())
            except OSError as exc:
                print(f"toolproxy: worker {self.index}: cannot publish stats: {exc}", file=sys.stderr, flush=True)

    def live_socket(self, pid: int) -> Path:
        return self.peers_dir / f"live-{pid}.sock"

    def peer_live_sockets(self) -> list[Path]:
        """The sockets of the other running workers' classifiers (blocking: a file read)."""
        try:
            pids = orjson.loads((self.peers_dir / "supervisor.json").read_bytes()).get("pids", ())
        except (OSError, orjson.JSONDecodeError):
            return []
        return [self.live_socket(pid) for pid in pids if pid != self.pid]

    async def merged(self, own: dict) -> dict:
        """The group's snapshot: this worker's live numbers plus its peers' latest published ones."""
        live, retired, supervisor = await asyncio.get_running_loop().run_in_executor(None, read_peers, self.peers_dir)
        return group_snapshot(self.stamped(own), live, retired, supervisor)


def worker_main() -> None:
    """Entry point of a worker process: its settings arrive pickled on stdin, never in argv
    (they may hold the upstream key)."""
    config, index, peers_dir = pickle.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    _die_with_parent()
    from toolproxy.proxy.server import run

    worker = Worker(index, Path(peers_dir))
    run(config, worker.attach, worker.listening)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker if the supervisor dies without stopping it (kill -9)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# ---- the supervisor -----------------------------------------------------------------------------


class StartError(RuntimeError):
    """The group could not start; the message says why and what to do."""


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    failures: int = 0
    next_start: float = 0.0
    restarts: int = 0


class Supervisor:
    def __init__(self, config: ProxyConfig, count: int) -> None:
        self.config = config
        self.count = count
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.peers_dir = Path(tempfile.mkdtemp(prefix="toolproxy-workers-", dir=base))
        self.slots = [_Slot(i) for i in range(count)]
        self.restarts = 0
        self.last_exit: str | None = None
        self.stopping = False
        self._reserve: socket.socket | None = None

    def reserve_port(self) -> int:
        """Bind (not listen) the address with SO_REUSEPORT: a port taken by another program fails
        here with a clear message, and --port 0 becomes one concrete port every worker shares."""
        cfg = self.config
        try:
            infos = socket.getaddrinfo(cfg.host, cfg.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise StartError(f"cannot listen on {cfg.host}:{cfg.port}: {exc}") from None
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            sock.close()
            raise StartError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}") from None
        self._reserve = sock
        return sock.getsockname()[1]

    def _spawn(self, slot: _Slot) -> None:
        payload = pickle.dumps((self.config, slot.index, str(self.peers_dir)))
        proc = subprocess.Popen(
            [sys.executable, "-c", "from toolproxy.proxy.workers import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
        )
        proc.stdin.write(payload)
        proc.stdin.close()
        slot.proc = proc
        slot.started = time.monotonic()
        self._write_supervisor()

    def _write_supervisor(self) -> None:
        running = {s.index: s.proc.pid for s in self.slots if s.proc is not None and s.proc.poll() is None}
        info = {
            "count": self.count,
            "pids": list(running.values()),
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "slots": [{"index": s.index, "pid": running.get(s.index), "restarts": s.restarts} for s in self.slots],
        }
        tmp = self.peers_dir / "supervisor.tmp"
        tmp.write_bytes(orjson.dumps(info))
        os.replace(tmp, self.peers_dir / "supervisor.json")

    def _ready(self, slot: _Slot) -> bool:
        return slot.proc is not None and (self.peers_dir / f"worker-{slot.proc.pid}.json").exists()

    def start(self, timeout: float = 60.0) -> None:
        for slot in self.slots:
            self._spawn(slot)
        deadline = time.monotonic() + timeout
        while not all(self._ready(s) for s in self.slots):
            for s in self.slots:
                if s.proc.poll() is not None:
                    raise StartError(
                        f"worker {s.index} exited with {_exit_text(s.proc.returncode)} while starting "
                        "(its error is printed above)"
                    )
            if self.stopping:
                return
            if time.monotonic() > deadline:
                raise StartError(f"workers did not start within {timeout:g}s")
            time.sleep(0.05)

    def watch(self, tick: float = 0.2) -> None:
        """Until told to stop: restart workers that died, with back-off so a crash loop stays cheap."""
        while not self.stopping:
            now = time.monotonic()
            for slot in self.slots:
                proc = slot.proc
                if proc is not None and proc.poll() is not None:
                    self._retire(slot, now)
                if slot.proc is None and now >= slot.next_start and not self.stopping:
                    self.restarts += 1
                    slot.restarts += 1
                    self._spawn(slot)
            time.sleep(tick)

    def _retire(self, slot: _Slot, now: float) -> None:
        proc = slot.proc
        live_file = self.peers_dir / f"worker-{proc.pid}.json"
        if live_file.exists():
            retire_snapshot(live_file, self.peers_dir / f"retired-{proc.pid}.json", _exit_text(proc.returncode))
        slot.failures = slot.failures + 1 if now - slot.started < 30 else 1
        delay = min(0.5 * 2 ** (slot.failures - 1), 30.0)
        self.last_exit = f"worker {slot.index} (pid {proc.pid}) exited with {_exit_text(proc.returncode)}"
        print(f"toolproxy: {self.last_exit}; restarting it in {delay:g}s", file=sys.stderr, flush=True)
        slot.proc = None
        slot.next_start = now + delay
        self._write_supervisor()

    def stop(self) -> None:
        """SIGTERM every worker, wait for their records to be flushed, SIGKILL what hangs."""
        self.stopping = True
        procs = [s.proc for s in self.slots if s.proc is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(
                    f"toolproxy: worker pid {p.pid} did not stop within {STOP_GRACE:g}s; killing it",
                    file=sys.stderr,
                    flush=True,
                )
                p.kill()
                p.wait()
        if self._reserve is not None:
            self._reserve.close()
        shutil.rmtree(self.peers_dir, ignore_errors=True)


def retire_snapshot(live: Path, retired: Path, exit_text: str) -> None:
    """Keep a dead worker's last numbers, marked with how and when it exited."""
    try:
        snap = orjson.loads(live.read_bytes())
        snap["worker"].update({"exit": exit_text, "exited_at": time.time()})
        tmp = retired.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(snap))
        os.replace(tmp, retired)
        live.unlink()
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        os.replace(live, retired)  # unmarked (a full tmpfs, an odd file) rather than lost


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def run_workers(config: ProxyConfig, count: int) -> int:
    """Run `count` workers until SIGINT/SIGTERM; the exit code for the CLI."""
    from toolproxy.proxy.server import banner

    sup = Supervisor(config, count)

    def on_signal(signum, frame) -> None:
        sup.stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        port = sup.reserve_port()
        sup.config = replace(config, port=port)
        sup.start()
        if not sup.stopping:
            print(banner(config, port, count), flush=True)
            sup.watch()
        print("toolproxy: shutting down, flushing records", file=sys.stderr, flush=True)
        return 0
    except StartError as exc:
        print(f"toolproxy: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        sup.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
