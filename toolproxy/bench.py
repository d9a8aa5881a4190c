"""Side-by-side benchmark: direct vs toolproxy (recording) vs a bare aiohttp pass-through vs nginx.

    python -m toolproxy.bench [--seconds 5] [--rounds 3] [--total 100000] [--workers 1,2] [--c1-requests 2000]

Everything runs on 127.0.0.1 in separate processes: a fast fake upstream, each target in front
of it, and `wrk` (Debian package) as the load generator. Targets are measured in interleaved
rounds and reported as medians and ratios, because this machine is shared and noisy: absolute
numbers mean little, ratios measured in one run do. nginx is included when installed.

The bare pass-through is written here for the comparison: the same aiohttp + uvloop forwarding
with no tags, no record and no writer, so the ratio isolates what recording costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

CHAT_BODY = json.dumps(
    {
        "model": "bench",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant with tools."},
            {"role": "user", "content": "What is the weather in Paris? " * 8},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
            }
        ],
    }
).encode()

REPLY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132},
    }
).encode()

STREAM_CHUNKS = 8
STREAM_GAP = 0.01


# ---- the fake upstream: a raw asyncio HTTP/1.1 server, fast enough not to be the bottleneck ----

class _Upstream(asyncio.Protocol):
    def connection_made(self, transport):
        self.t = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            m = re.search(r"(?im)^content-length:\s*(\d+)", head)
            n = int(m.group(1)) if m else 0
            if len(self.buf) < head_end + 4 + n:
                return
            body = self.buf[head_end + 4 : head_end + 4 + n]
            self.buf = self.buf[head_end + 4 + n :]
            if b'"stream": true' in body:
                self.stream()
            else:
                self.t.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(REPLY)).encode()
                    + b"\r\n\r\n"
                    + REPLY
                )

    def stream(self) -> None:
        """Answer a streaming request (a subclass may schedule its events differently)."""
        asyncio.ensure_future(self._stream())

    async def _stream(self):
        self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(STREAM_CHUNKS):
            event = b'data: {"choices":[{"index":0,"delta":{"content":"tok%d"}}]}\n\n' % i
            self.t.write(b"%x\r\n%s\r\n" % (len(event), event))
            await asyncio.sleep(STREAM_GAP)
        done = b"data: [DONE]\n\n"
        self.t.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


async def _serve_upstream(port: int, protocol=_Upstream) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# ---- the bare aiohttp pass-through (no recording) ------------------------------------------------

def _bare_app(upstream: str):
    import aiohttp
    from aiohttp import web

    hop = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}

    async def handle(request: web.Request) -> web.StreamResponse:
        session = request.app["session"]
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with session.request(request.method, upstream + request.raw_path, data=body or None, headers=headers) as up:
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in hop:
                    resp.headers.add(k, v)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def startup(app):
        # No pool limit: the baseline must not queue streams behind each other.
        app["session"] = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(limit=0))

    async def cleanup(app):
        await app["session"].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def _run_loop(coro_or_app, port: int | None = None) -> None:
    import uvloop

    if port is None:
        uvloop.run(coro_or_app)
        return
    from aiohttp import web

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(coro_or_app, host="127.0.0.1", port=port, print=None, access_log=None, reuse_port=True, backlog=4096)


# ---- orchestration ----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout}s")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _wrk(url: str, conns: int, seconds: float, script: Path) -> dict:
    threads = 1 if conns == 1 else 2
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script), url],
        capture_output=True, text=True, timeout=seconds + 60,
    ).stdout
    def lat(label: str) -> float:
        m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            raise RuntimeError(f"could not read {label} latency from wrk output:\n{out}")
        return float(m.group(1)) * {"us": 1.0, "ms": 1000.0, "s": 1e6}[m.group(2)]
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m:
        raise RuntimeError(f"wrk against {url} printed no result:\n{out}")
    rps = float(m.group(1))
    total = re.search(r"^\s*(\d+) requests in", out, re.M)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock_err = re.search(r"Socket errors: (.*)", out)
    return {"p50_us": lat("50%"), "p99_us": lat("99%"), "rps": rps, "requests": int(total.group(1)) if total else 0,
            "non2xx": int(errors.group(1)) if errors else 0, "socket_errors": sock_err.group(1) if sock_err else ""}


def _c1_interleaved(targets: dict[str, str], path: str, rounds: int) -> dict[str, dict]:
    """Latency at concurrency 1, one request to each target in turn over one keep-alive connection
    each, so a change in the machine's load falls on every target alike (a shared machine's load
    moves within seconds: measuring targets one after another for seconds each compares noise)."""
    addrs = {name: url.split("//", 1)[1] for name, url in targets.items()}
    requests = {
        name: (
            f"POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer sk-bench\r\nContent-Length: {len(CHAT_BODY)}\r\n\r\n"
        ).encode() + CHAT_BODY
        for name, addr in addrs.items()
    }
    conns: dict[str, socket.socket] = {}
    times: dict[str, list[float]] = {name: [] for name in targets}
    non2xx = dict.fromkeys(targets, 0)
    try:
        for _ in range(rounds):
            for name, addr in addrs.items():
                if name not in conns:  # nginx, for one, closes a keep-alive connection after 1000 requests
                    host, port = addr.rsplit(":", 1)
                    conns[name] = socket.create_connection((host, int(port)), timeout=30)
                    conns[name].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock = conns[name]
                t0 = time.perf_counter()
                sock.sendall(requests[name])
                status, keep = _read_response(sock)
                times[name].append((time.perf_counter() - t0) * 1e6)
                non2xx[name] += not 200 <= status < 300
                if not keep:
                    conns.pop(name).close()
    finally:
        for sock in conns.values():
            sock.close()
    out = {}
    for name, t in times.items():
        t.sort()
        out[name] = {"p50_us": t[len(t) // 2], "p99_us": t[min(len(t) - 1, int(len(t) * 0.99))], "non2xx": non2xx[name]}
    return out


def _read_response(sock: socket.socket) -> tuple[int, bool]:
    """Read one whole HTTP/1.1 response (Content-Length or chunked): its status, and whether the
    connection stays open."""
    buf = b""
    while (head_end := buf.find(b"\r\n\r\n")) < 0:
        buf += _recv(sock)
    head = buf[:head_end].decode("latin-1")
    body = buf[head_end + 4:]
    m = re.search(r"(?im)^content-length:\s*(\d+)", head)
    if m:
        while len(body) < int(m.group(1)):
            body += _recv(sock)
    else:
        while not body.endswith(b"0\r\n\r\n"):
            body += _recv(sock)
    return int(head.split(" ", 2)[1]), re.search(r"(?im)^connection:\s*close", head) is None


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise RuntimeError("a target closed its connection in the middle of a response")
    return data


async def _ttfb(url: str, n: int) -> list[float]:
    import aiohttp

    body = CHAT_BODY.replace(b'"model": "bench"', b'"model": "bench", "stream": true')
    times = []
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        for _ in range(n):
            t0 = time.perf_counter()
            async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                await r.content.readany()
                times.append((time.perf_counter() - t0) * 1e6)
                await r.read()
    return times


NGINX_CONF = """
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections {conns}; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream up {{ server 127.0.0.1:{up}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size 64m;
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (all their threads)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


class _PagePoller:
    """What an open /_toolproxy/ tab does: fetch the counters and the recent exchanges, again and again."""

    def __init__(self, url: str, every: float) -> None:
        self.url, self.every = url, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for path in ("/_toolproxy/stats", "/_toolproxy/live?limit=200"):
                urllib.request.urlopen(self.url + path, timeout=10).read()
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


class Fleet:
    """The processes one benchmark run starts on 127.0.0.1, each in its own session, all stopped
    together (SIGTERM, so toolproxy flushes its records; SIGKILL after 15 s)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.roots: dict[str, list[int]] = {}  # url -> the processes (and their children) serving it

    def spawn(self, cmd: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def upstream(self, module: str, *args: str) -> int:
        """The fake upstream served by `python -m module upstream PORT ...`; its port."""
        port = _free_port()
        p = self.spawn([sys.executable, "-m", module, "upstream", str(port), *args])
        self.roots[f"http://127.0.0.1:{port}"] = [p.pid]
        return port

    def toolproxy(self, upstream: str, data: Path, workers: int = 1, *extra: str) -> tuple[str, subprocess.Popen]:
        port = _free_port()
        proc = self.spawn([sys.executable, "-m", "toolproxy.cli", "serve", "--upstream", upstream, "--port", str(port),
                           "--data", str(data), "--quiet", "--workers", str(workers), *extra])
        self.roots[f"http://127.0.0.1:{port}"] = [proc.pid]
        return f"http://127.0.0.1:{port}", proc

    def bare(self, upstream: str, processes: int = 1) -> str:
        """The bare aiohttp pass-through; several processes share the port as toolproxy's workers do."""
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        self.roots[url] = [self.spawn([sys.executable, "-m", "toolproxy.bench", "bare", str(port), upstream]).pid
                           for _ in range(processes)]
        return url

    def nginx(self, up_port: int, connections: int = 4096) -> str | None:
        """nginx proxy_pass with buffering off (Debian's `nginx`), or None when it is not installed."""
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if binary is None:
            return None
        port = _free_port()
        for sub in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
            (self.tmp / sub).mkdir(exist_ok=True)
        conf = self.tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=self.tmp, up=up_port, port=port, conns=connections, nofile=connections * 2 + 64))
        self.roots[f"http://127.0.0.1:{port}"] = [self.spawn([binary, "-c", str(conf), "-g", "daemon off;"]).pid]
        return f"http://127.0.0.1:{port}"

    def cpu_s(self, url: str) -> float:
        """CPU seconds used so far by everything serving `url` (workers and threads included)."""
        return cpu_seconds([pid for root in self.roots[url] for pid in process_tree(root)])

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="wrk duration per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--total", type=int, default=100_000, help="requests through toolproxy before the RSS reading")
    ap.add_argument("--ttfb-requests", type=int, default=200)
    ap.add_argument("--c1-requests", type=int, default=2000, help="sequential requests per target per round for c1 latency")
    ap.add_argument("--workers", type=_int_list, default=[1], help="toolproxy --workers counts to measure, e.g. 1,2 "
                    "(the bare pass-through runs as as many processes); the first must be 1")
    ap.add_argument("--no-nginx", action="store_true", help="leave nginx out even when installed")
    ap.add_argument("--json", dest="json_out", help="also write the raw numbers here")
    ap.add_argument("--page-poll", type=float, default=None, metavar="SECONDS",
                    help="also measure a toolproxy whose /_toolproxy/ page is open all along (its JSON polled this "
                         "often) and one started with --no-live-page")
    ap.add_argument("_role", nargs="?", help=argparse.SUPPRESS)
    ap.add_argument("_port", nargs="?", type=int, help=argparse.SUPPRESS)
    ap.add_argument("_upstream", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._role == "upstream":
        _run_loop(_serve_upstream(args._port))
        return 0
    if args._role == "bare":
        _run_loop(_bare_app(args._upstream), args._port)
        return 0
    if args.workers[0] != 1:
        ap.error("--workers: the first count must be 1 (the ratios compare single processes)")

    if not shutil.which("wrk"):
        print("toolproxy.bench needs wrk (Debian: apt-get install wrk)", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="toolproxy-bench-"))
    script = tmp / "post.lua"
    script.write_text(
        "wrk.method = 'POST'\nwrk.headers['Content-Type'] = 'application/json'\n"
        f"wrk.headers['Authorization'] = 'Bearer sk-bench'\nwrk.body = [[{CHAT_BODY.decode()}]]\n"
    )
    fleet = Fleet(tmp)
    up_port = fleet.upstream("toolproxy.bench")
    upstream = f"http://127.0.0.1:{up_port}"
    targets = {"direct": upstream}
    for n in args.workers:
        name = "toolproxy" if n == 1 else f"toolproxy_w{n}"
        targets[name], proc = fleet.toolproxy(upstream, tmp / f"data-{name}", n)
        if n == 1:
            tp = proc
    for n in args.workers:
        targets["bare_aiohttp" if n == 1 else f"bare_aiohttp_w{n}"] = fleet.bare(upstream, n)
    if args.page_poll:
        targets["toolproxy_no_page"] = fleet.toolproxy(upstream, tmp / "data-off", 1, "--no-live-page")[0]
        targets["toolproxy_page_open"] = fleet.toolproxy(upstream, tmp / "data-page")[0]
    if not args.no_nginx and (nginx := fleet.nginx(up_port)) is not None:
        targets["nginx"] = nginx
    data = tmp / "data-toolproxy"
    page = None

    results: dict[str, dict[str, list[float]]] = {name: {} for name in targets}
    try:
        for url in targets.values():
            _wait_http(url)
        path = "/v1/chat/completions"
        for url in targets.values():  # warm-up: connections, caches, JIT-free but allocator-warm
            _wrk(url + path, 16, 1, script)
        rss_warm = _rss_kb(tp.pid)
        if args.page_poll:
            page = _PagePoller(targets["toolproxy_page_open"], args.page_poll)
        for rnd in range(args.rounds):
            c1_all = _c1_interleaved(targets, path, args.c1_requests)
            for name, url in targets.items():
                c1 = c1_all[name]
                cpu0 = fleet.cpu_s(url)
                c64 = _wrk(url + path, 64, args.seconds, script)
                cpu_per_req = (fleet.cpu_s(url) - cpu0) / max(c64["requests"], 1) * 1e6
                ttfb = asyncio.run(_ttfb(url + path, args.ttfb_requests))
                r = results[name]
                for key, val in (("c1_p50", c1["p50_us"]), ("c1_p99", c1["p99_us"]), ("c64_rps", c64["rps"]),
                                 ("c64_p99", c64["p99_us"]), ("c64_cpu_us", cpu_per_req), ("ttfb_p50", statistics.median(ttfb)),
                                 ("errors", c1["non2xx"] + c64["non2xx"])):
                    r.setdefault(key, []).append(val)
                print(f"round {rnd + 1}/{args.rounds} {name}: c1 p50 {c1['p50_us']:.0f}us, c64 {c64['rps']:.0f} req/s ({cpu_per_req:.0f} us CPU/req), "
                      f"ttfb p50 {statistics.median(ttfb):.0f}us", file=sys.stderr, flush=True)
        stats = json.loads(urllib.request.urlopen(targets["toolproxy"] + "/_toolproxy/stats").read())
        while stats["exchanges"] < args.total:
            _wrk(targets["toolproxy"] + path, 64, 5, script)
            stats = json.loads(urllib.request.urlopen(targets["toolproxy"] + "/_toolproxy/stats").read())
        time.sleep(1.0)
        stats = json.loads(urllib.request.urlopen(targets["toolproxy"] + "/_toolproxy/stats").read())
        rss_after = _rss_kb(tp.pid)
        seg_bytes = sum(p.stat().st_size for p in (data / "segments").glob("*.jsonl"))
        views = {name: json.loads(urllib.request.urlopen(targets[name] + "/_toolproxy/live?limit=1").read())
                 for name in ("toolproxy", "toolproxy_page_open") if name in targets}
    finally:
        if page is not None:
            page.stop()
        fleet.stop()

    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    direct = med["direct"]
    lines = [
        f"toolproxy.bench: {args.rounds} interleaved rounds x {args.seconds:g}s per measurement, medians; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; c1: {args.c1_requests} requests per target "
        "per round, targets taking turns request by request; c64: wrk on 127.0.0.1",
        "",
        "| target | c1 p50 (us) | added p50 (us) | c1 p99 (us) | c64 req/s | c64 p99 (us) | c64 CPU/req (us) | stream TTFB p50 (us) | TTFB overhead (us) | non-2xx |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in med.items():
        added = m["c1_p50"] - direct["c1_p50"]
        ttfb_over = m["ttfb_p50"] - direct["ttfb_p50"]
        lines.append(
            f"| {name} | {m['c1_p50']:.0f} | {added:.0f} | {m['c1_p99']:.0f} | {m['c64_rps']:.0f} | {m['c64_p99']:.0f} | {m['c64_cpu_us']:.0f} | "
            f"{m['ttfb_p50']:.0f} | {ttfb_over:.0f} | {int(sum(results[name]['errors']))} |"
        )
    tpm, bare = med["toolproxy"], med["bare_aiohttp"]
    added_tp = tpm["c1_p50"] - direct["c1_p50"]
    added_bare = bare["c1_p50"] - direct["c1_p50"]
    written = stats["recording"]["written"]
    lines += [
        "",
        "| ratio (toolproxy vs bare aiohttp pass-through) | value | target |",
        "|---|---|---|",
        f"| c64 throughput | {tpm['c64_rps'] / bare['c64_rps']:.2f}x | >= 1.0x |",
        f"| c64 CPU per request (bare / toolproxy: throughput a free core would give) | {bare['c64_cpu_us'] / tpm['c64_cpu_us']:.2f}x | >= 1.0x |",
        f"| added p50 latency at c1 | {added_tp / added_bare:.2f}x | <= 1.1x |" if added_bare > 0 else "| added p50 latency at c1 | n/a | <= 1.1x |",
        f"| stream TTFB overhead vs direct | {(tpm['ttfb_p50'] - direct['ttfb_p50']) / 1000:.2f} ms | < 2 ms |",
        f"| RSS after warm-up -> after {stats['exchanges']} exchanges | {rss_warm / 1024:.1f} MiB -> {rss_after / 1024:.1f} MiB | flat |",
        f"| bytes on disk per exchange | {seg_bytes / max(written, 1):.0f} B | - |",
        f"| records written / dropped | {written} / {stats['recording']['dropped']} | all / 0 |",
    ]
    if page is not None:
        pg, off = med["toolproxy_page_open"], med["toolproxy_no_page"]
        lines += [
            f"| c64 throughput, /_toolproxy/ page open (polled every {args.page_poll:g}s) vs closed | "
            f"{pg['c64_rps'] / tpm['c64_rps']:.2f}x | >= 0.95x |",
            f"| c1 p50 latency, page open vs closed | {pg['c1_p50'] / tpm['c1_p50']:.2f}x | <= 1.05x |",
            f"| c64 throughput, page closed (classifier running) vs --no-live-page | {tpm['c64_rps'] / off['c64_rps']:.2f}x | >= 0.95x |",
        ]
        for name, v in views.items():
            lines.append(f"| {name}: exchanges classified / counted unclassified (classifier behind) | "
                         f"{v['classified']} / {sum(v['unclassified'].values())} | - |")
    for n in args.workers[1:]:
        tpn, baren = med[f"toolproxy_w{n}"], med[f"bare_aiohttp_w{n}"]
        lines += [
            f"| c64 throughput, {n} workers vs 1 (toolproxy) | {tpn['c64_rps'] / tpm['c64_rps']:.2f}x | - |",
            f"| c64 throughput, {n} processes vs 1 (bare aiohttp) | {baren['c64_rps'] / bare['c64_rps']:.2f}x | - |",
            f"| c64 throughput, toolproxy vs bare, {n} processes each | {tpn['c64_rps'] / baren['c64_rps']:.2f}x | - |",
        ]
    print("\n".join(lines))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"medians": med, "raw": results, "rss_warm_kb": rss_warm,
                                                   "rss_after_kb": rss_after, "segment_bytes": seg_bytes,
                                                   "proxy_stats": stats}, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
