"""Production-shaped benchmark: thousands of concurrent SSE streams through each proxy at once.

    python -m benchmarks.streams [--streams 1000,2000] [--rate 10] [--seconds 10] [--rounds 1]

An inference fleet holds many long streams open at the same time, each trickling tokens. Here a
burst of N clients opens N streams at once (each on its own connection); the fake upstream sends
`--rate` events a second for `--seconds` per stream, stamping each event with the monotonic
clock when it leaves. Targets are measured in interleaved rounds: the upstream directly, toolproxy
(recording), the bare aiohttp pass-through from `benchmarks.proxy`, and nginx when installed.

Per target: time to first event (p50/p99), how long an event took from the upstream's write to the
client's read (p50/p99, and what the proxy adds over direct), wall time of the whole burst (ideal:
--seconds), peak RSS and CPU seconds of the proxy's processes, streams that did not complete, and
for toolproxy the records lost (streams answered minus records on disk: must be 0).

Upstream and client are raw asyncio (uvloop) so neither is the bottleneck: the upstream sends
from one timer wheel instead of a task per stream, and the client counts events with one regex
over each read. Everything is on 127.0.0.1 and bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from benchmarks.proxy import (
    Fleet,
    _int_list,
    _run_loop,
    _serve_upstream,
    _Upstream,
    _wait_http,
    cpu_seconds,
    process_tree,
)
from toolproxy.proxy.workers import raise_fd_limit

PATH = "/v1/chat/completions"
# The shape of a real OpenAI-style chunk (~200 bytes), plus the upstream's send time in ns.
EVENT = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":"tok%d"},"finish_reason":null}],"t":%d}\n\n'
)
DONE = b"data: [DONE]\n\n"
SLOT = 0.005  # the timer wheel's resolution; the stamp says when an event really left


# ---- the upstream: one timer wheel for every open stream ----------------------------------------


class _Wheel:
    """Streams due in each SLOT-wide bucket of time; one task sends whatever is due."""

    def __init__(self, events: int, gap: float) -> None:
        self.events, self.gap = events, gap
        self.buckets: dict[int, list] = defaultdict(list)
        self.next_slot = 0  # the first bucket not yet sent
        self.task: asyncio.Task | None = None

    def add(self, transport) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        if self.task is None:
            self.next_slot = int(time.monotonic() / SLOT)
            self.task = asyncio.get_running_loop().create_task(self._run())
        self._due(time.monotonic(), [transport, 0])

    def _due(self, at: float, stream: list) -> None:
        self.buckets[max(int(at / SLOT), self.next_slot)].append(stream)

    async def _run(self) -> None:
        while True:
            now_slot = int(time.monotonic() / SLOT)
            while self.next_slot <= now_slot:
                for stream in self.buckets.pop(self.next_slot, ()):
                    self._send(stream)
                self.next_slot += 1
            await asyncio.sleep(SLOT)

    def _send(self, stream: list) -> None:
        transport, sent = stream
        if transport.is_closing():
            return
        if sent == self.events:
            transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE))
            return
        event = EVENT % (sent, time.monotonic_ns())
        transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        stream[1] = sent + 1
        self._due(time.monotonic() + self.gap, stream)


def _upstream_protocol(wheel: _Wheel):
    class SSEUpstream(_Upstream):
        def stream(self) -> None:
            wheel.add(self.t)

    return SSEUpstream


# ---- the client: N streams at once, raw asyncio ------------------------------------------------

_STAMP = re.compile(rb'"t":(\d+)\}')


class _StreamClient(asyncio.Protocol):
    def __init__(self, request: bytes, t0: int, done: asyncio.Future, delays: list[int]) -> None:
        self.request, self.t0, self.done, self.delays = request, t0, done, delays
        self.head = b""
        self.tail = b""
        self.status: int | None = None
        self.ttfb: int | None = None
        self.events = 0
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self.status is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = int(self.head[9:12])
            if self.status != 200:  # an error answer is the end of this stream
                self.transport.close()
                return
            data, self.head = self.head[end + 4 :], b""
        buf = self.tail + data
        cut = buf.rfind(b"\n\n")  # only whole events; the rest waits for the next read
        if cut < 0:
            self.tail = buf
            return
        whole, self.tail = buf[: cut + 2], buf[cut + 2 :]
        stamps = _STAMP.findall(whole)
        if stamps:
            if self.ttfb is None:
                self.ttfb = now - self.t0
            self.events += len(stamps)
            self.delays.extend(now - int(s) for s in stamps)
        if b"[DONE]" in whole:
            self.transport.close()
            if not self.done.done():
                self.done.set_result(True)

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_result(False)


async def _burst(port: int, path: str, streams: int, events: int, deadline: float) -> dict:
    loop = asyncio.get_running_loop()
    body = b'{"model": "bench", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-bench\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    delays: list[int] = []
    clients: list[_StreamClient] = []
    failed_connects = 0

    async def one() -> bool:
        nonlocal failed_connects
        done = loop.create_future()
        client = _StreamClient(request, time.monotonic_ns(), done, delays)
        clients.append(client)
        try:
            await loop.create_connection(lambda: client, "127.0.0.1", port)
        except OSError:
            failed_connects += 1
            return False
        return await done

    t0 = time.monotonic()
    tasks = [loop.create_task(one()) for _ in range(streams)]
    finished, pending = await asyncio.wait(tasks, timeout=deadline)
    wall = time.monotonic() - t0
    for t in pending:
        t.cancel()
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    complete = sum(1 for t in finished if not t.cancelled() and t.exception() is None and t.result())
    ttfbs = sorted(c.ttfb / 1e6 for c in clients if c.ttfb is not None)
    delays_ms = sorted(d / 1e6 for d in delays)
    return {
        "streams": streams,
        "complete": complete,
        "failed_connects": failed_connects,
        "statuses": {str(k): v for k, v in Counter(c.status for c in clients).items()},
        "short": sum(1 for c in clients if c.events != events),
        "wall_s": wall,
        "ttfb_p50_ms": _pct(ttfbs, 50),
        "ttfb_p99_ms": _pct(ttfbs, 99),
        "delay_p50_ms": _pct(delays_ms, 50),
        "delay_p99_ms": _pct(delays_ms, 99),
        "events": len(delays_ms),
    }


def _pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p / 100))]


# ---- measuring a process tree ------------------------------------------------------------------


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class _Sampler(threading.Thread):
    """Peak RSS of a process tree, sampled while a burst runs."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids, self.peak, self.stop = pids, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.peak = max(self.peak, _rss_mb(self.pids))


def _measure(pid: int | None, port: int, path: str, streams: int, events: int, deadline: float) -> dict:
    pids = process_tree(pid) if pid is not None else []
    sampler = _Sampler(pids)
    cpu0 = cpu_seconds(pids)
    sampler.start()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.streams",
            "client",
            str(port),
            path,
            str(streams),
            str(events),
            str(deadline),
        ],
        capture_output=True,
        text=True,
        timeout=deadline + 60,
    )
    sampler.stop.set()
    sampler.join()
    if out.returncode != 0:
        raise RuntimeError(f"the load client failed:\n{out.stderr}")
    result = json.loads(out.stdout)
    result["cpu_s"] = cpu_seconds(pids) - cpu0
    result["rss_peak_mb"] = max(sampler.peak, _rss_mb(pids))
    return result


def _count_records(data: Path) -> dict[str, int]:
    """Complete exchange records per run tag (each burst has its own)."""
    from toolproxy.record.segments import read_records

    counts: dict[str, int] = defaultdict(int)
    for rec in read_records(data, "exchange"):
        if rec.get("status") == 200 and rec.get("response_complete"):
            counts[rec.get("run")] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--streams", type=_int_list, default=[1000, 2000], help="concurrent streams per burst, e.g. 1000,2000"
    )
    ap.add_argument("--rate", type=float, default=10.0, help="events per second per stream")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long each stream lasts")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians are reported")
    ap.add_argument("--workers", type=_int_list, default=[1], help="toolproxy --workers counts to measure, e.g. 1,2")
    ap.add_argument("--json", dest="json_out", help="also write the raw numbers here")
    ap.add_argument("_role", nargs="?", help=argparse.SUPPRESS)
    ap.add_argument("_args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    raise_fd_limit()

    if args._role == "upstream":
        port, events, gap = int(args._args[0]), int(args._args[1]), float(args._args[2])
        _run_loop(_upstream_main(port, events, gap))
        return 0
    if args._role == "client":
        port, path, streams, events, deadline = args._args
        import uvloop

        result = uvloop.run(_burst(int(port), path, int(streams), int(events), float(deadline)))
        print(json.dumps(result))
        return 0

    events = max(1, round(args.rate * args.seconds))
    deadline = args.seconds * 3 + 30
    tmp = Path(tempfile.mkdtemp(prefix="toolproxy-bench-streams-"))
    fleet = Fleet(tmp)
    up_port = fleet.upstream("benchmarks.streams", str(events), str(1.0 / args.rate))
    upstream = f"http://127.0.0.1:{up_port}"
    targets: dict[str, tuple[str, int | None]] = {"direct": (upstream, fleet.procs[-1].pid)}
    data: dict[str, Path] = {}
    for n in args.workers:
        name = "toolproxy" if n == 1 else f"toolproxy_w{n}"
        data[name] = tmp / f"data-{name}"
        url, proc = fleet.toolproxy(upstream, data[name], n)
        targets[name] = (url, proc.pid)
    url = fleet.bare(upstream)
    targets["bare_aiohttp"] = (url, fleet.procs[-1].pid)
    nginx = fleet.nginx(up_port, connections=max(args.streams) * 4 + 256)
    if nginx is not None:
        targets["nginx"] = (nginx, fleet.procs[-1].pid)
    else:
        print("nginx is not installed (Debian: apt-get install nginx-light): measuring without it", file=sys.stderr)

    results: dict[tuple[str, int], list[dict]] = defaultdict(list)
    try:
        for url, _ in targets.values():
            _wait_http(url)
        for rnd in range(args.rounds):
            for streams in args.streams:
                for name, (url, pid) in targets.items():
                    run = f"sse-{streams}-r{rnd}"
                    port = int(url.rsplit(":", 1)[1])
                    r = _measure(
                        None if name == "direct" else pid,
                        port,
                        f"/t/run={run}{PATH}" if name.startswith("toolproxy") else PATH,
                        streams,
                        events,
                        deadline,
                    )
                    r["run"] = run
                    results[(name, streams)].append(r)
                    print(
                        f"round {rnd + 1}/{args.rounds} {streams} streams {name}: ttfb p50/p99 "
                        f"{r['ttfb_p50_ms']:.1f}/{r['ttfb_p99_ms']:.1f} ms, delay p50/p99 {r['delay_p50_ms']:.1f}/"
                        f"{r['delay_p99_ms']:.1f} ms, wall {r['wall_s']:.1f}s, complete {r['complete']}/{streams}, "
                        f"statuses {r['statuses']}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        fleet.stop()  # SIGTERM: toolproxy flushes every record before it exits

    lost: dict[tuple[str, int], int] = {}
    for name, path in data.items():
        on_disk = _count_records(path)
        for streams in args.streams:
            runs = results[(name, streams)]
            lost[(name, streams)] = sum(r["complete"] - on_disk.get(r["run"], 0) for r in runs)

    load = os.getloadavg()
    lines = [
        f"benchmarks.streams: {args.rounds} interleaved round(s); bursts of N concurrent SSE streams, "
        f"{args.rate:g} events/s for {args.seconds:g}s each ({events} events); {os.cpu_count()} cores, "
        f"load average {load[0]:.1f} at the end; medians over rounds",
        "",
        "| streams | target | TTFB p50 (ms) | TTFB p99 (ms) | event delay p50 (ms) | event delay p99 (ms) | added p50 "
        "(ms) | "
        "added p99 (ms) | wall (s) | peak RSS (MiB) | CPU (s) | incomplete | records lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary: dict = {}
    for streams in args.streams:
        direct = _median_of(results[("direct", streams)])
        for name in targets:
            m = _median_of(results[(name, streams)])
            summary[f"{name}@{streams}"] = m
            incomplete = sum(r["streams"] - r["complete"] for r in results[(name, streams)])
            rec_lost = str(lost[(name, streams)]) if (name, streams) in lost else "-"
            rss = f"{m['rss_peak_mb']:.0f}" if name != "direct" else "-"
            cpu = f"{m['cpu_s']:.1f}" if name != "direct" else "-"
            lines.append(
                f"| {streams} | {name} | {m['ttfb_p50_ms']:.1f} | {m['ttfb_p99_ms']:.1f} | {m['delay_p50_ms']:.2f} | "
                f"{m['delay_p99_ms']:.2f} | {m['delay_p50_ms'] - direct['delay_p50_ms']:.2f} | "
                f"{m['delay_p99_ms'] - direct['delay_p99_ms']:.2f} | {m['wall_s']:.1f} | {rss} | {cpu} | {incomplete} "
                f"| {rec_lost} |"
            )
    print("\n".join(lines))
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {
                    "medians": summary,
                    "raw": {f"{k[0]}@{k[1]}": v for k, v in results.items()},
                    "records_lost": {f"{k[0]}@{k[1]}": v for k, v in lost.items()},
                },
                indent=2,
            )
        )
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if any(lost.values()) else 0


def _median_of(runs: list[dict]) -> dict:
    keys = ("ttfb_p50_ms", "ttfb_p99_ms", "delay_p50_ms", "delay_p99_ms", "wall_s", "rss_peak_mb", "cpu_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys}


async def _upstream_main(port: int, events: int, gap: float) -> None:
    await _serve_upstream(port, _upstream_protocol(_Wheel(events, gap)))


if __name__ == "__main__":
    sys.exit(main())
