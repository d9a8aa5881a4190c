"""Side-by-side benchmark: direct vs toolproxy (recording) vs a bare aiohttp pass-through vs nginx,
and `toolproxy playback` answering the same request from a recording of it.

    python -m benchmarks.proxy [--seconds 5] [--rounds 3] [--total 100000] [--workers 1,2] [--c1-requests 2000]

Everything runs on 127.0.0.1 in separate processes: a fast fake upstream, each target in front
of it, and `wrk` (Debian package) as the load generator. Targets are measured in interleaved
rounds and reported as medians and ratios, because this machine is shared and noisy: absolute
numbers mean little, ratios measured in one run do. nginx is included when installed.

The bare pass-through is written here for the comparison: the same aiohttp + uvloop forwarding
with no tags, no record and no writer, so the ratio isolates what recording costs. The playback
target serves the one exchange `serve` recorded for the benchmark's request (with `--match
reuse=on`, since wrk asks it again and again): an agent test against a recording should be no
slower than the same test through `serve`.
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

from benchmarks import profiling as benchprofile

# A ~1.9 KB chat request of an agent's second turn: system prompt, a tool call and its result, two
# tools (the size the independent rig used).
CHAT_BODY = json.dumps(
    {
        "model": "bench",
        "messages": [
            {
                "role": "system",
                "content": "You are a careful assistant with tools. Call a tool when it helps; "
                "answer in one short paragraph otherwise. " * 4,
            },
            {
                "role": "user",
                "content": "What is the weather in Paris, and should I take an umbrella to the museum "
                "this afternoon? " * 2,
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_0",
                "content": '{"city": "Paris", "temperature_c": 14, "conditions": "light rain", "wind_kmh": 12}',
            },
            {"role": "user", "content": "And tomorrow in Lyon?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city: temperature, conditions, wind and humidity",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "description": "City name"},
                            "day": {"type": "string", "enum": ["today", "tomorrow"]},
                        },
                        "required": ["city"],
                    },
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "search_events",
                    "description": "Events in a city on a given day, with opening hours and prices",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string"},
                            "date": {"type": "string", "format": "date"},
                            "category": {"type": "string", "enum": ["museum", "music", "sport", "food"]},
                        },
                        "required": ["city", "date"],
                    },
                },
            },
        ],
        "tool_choice": "auto",
        "temperature": 0.2,
        "max_tokens": 256,
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
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132},
    }
).encode()

# The same request asking for a stream (the TTFB column).
STREAM_BODY = CHAT_BODY.replace(b'"model": "bench"', b'"model": "bench", "stream": true')

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
        async with session.request(
            request.method, upstream + request.raw_path, data=body or None, headers=headers
        ) as up:
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


def _otlp_sink():
    """An OTLP/HTTP receiver that takes every request and keeps nothing (what --otlp measures against)."""
    from aiohttp import web

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    return app


def _run_loop(coro_or_app, port: int | None = None, use_uvloop: bool = True) -> None:
    import uvloop

    if port is None:
        uvloop.run(coro_or_app)
        return
    from aiohttp import web

    if use_uvloop:
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


def _wrk_command(url: str, conns: int, seconds: float, script: Path) -> list[str]:
    threads = 1 if conns == 1 else 2
    return ["wrk", f"-t{threads}", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script), url]


def _wrk(url: str, conns: int, seconds: float, script: Path) -> dict:
    out = subprocess.run(
        _wrk_command(url, conns, seconds, script), capture_output=True, text=True, timeout=seconds + 60
    ).stdout
    return _wrk_result(url, out)


def _wrk_result(url: str, out: str) -> dict:
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
    return {
        "p50_us": lat("50%"),
        "p99_us": lat("99%"),
        "rps": rps,
        "requests": int(total.group(1)) if total else 0,
        "non2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": sock_err.group(1) if sock_err else "",
    }


def _c1_interleaved(targets: dict[str, str], path: str, rounds: int) -> dict[str, dict]:
    """Latency at concurrency 1, one request to each target in turn over one keep-alive connection
    each, so a change in the machine's load falls on every target alike (a shared machine's load
    moves within seconds: measuring targets one after another for seconds each compares noise)."""
    addrs = {name: url.split("//", 1)[1] for name, url in targets.items()}
    requests = {
        name: (
            f"POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer sk-bench\r\nContent-Length: {len(CHAT_BODY)}\r\n\r\n"
        ).encode()
        + CHAT_BODY
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
    body = buf[head_end + 4 :]
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

    times = []
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        for _ in range(n):
            t0 = time.perf_counter()
            async with s.post(url, data=STREAM_BODY, headers={"Content-Type": "application/json"}) as r:
                await r.content.readany()
                times.append((time.perf_counter() - t0) * 1e6)
                await r.read()
    return times


# What every nginx here has: one worker, its files in its own directory, no access log.
_NGINX_HEAD = """
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections {conns}; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
"""

NGINX_CONF = (
    _NGINX_HEAD
    + """  upstream up {{ server 127.0.0.1:{up}; keepalive 128; }}
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
)


# nginx as the upstream: the reply from memory, keep-alive without a request limit (a proxy's pool
# reconnecting every 1,000 requests would be measured otherwise).
NGINX_UPSTREAM_CONF = (
    _NGINX_HEAD
    + """  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    client_max_body_size 64m;
    client_body_buffer_size 64k;
    location / {{
      default_type application/json;
      return 200 '{reply}';
    }}
  }}
}}
"""
)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


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


def rss_kb(pids: list[int]) -> int:
    """Resident memory of these processes, summed (what `ps` shows per process, added up)."""
    total = 0
    for pid in pids:
        try:
            total += _rss_kb(pid)
        except OSError:
            continue
    return total


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
        proc = self.spawn(
            [
                sys.executable,
                "-m",
                "toolproxy.cli",
                "serve",
                "--upstream",
                upstream,
                "--port",
                str(port),
                "--data",
                str(data),
                "--quiet",
                "--workers",
                str(workers),
                *extra,
            ]
        )
        self.roots[f"http://127.0.0.1:{port}"] = [proc.pid]
        return f"http://127.0.0.1:{port}", proc

    def playback(self, upstream: str, data: Path) -> str:
        """`toolproxy playback` of the benchmark's requests (whole and streamed) as `serve` recorded
        them from `upstream`."""
        recorder, proc = self.toolproxy(upstream, data, 1, "--run", PLAYED, "--durability", "sync", "--no-fingerprint")
        _wait_http(recorder)
        for body in (CHAT_BODY, STREAM_BODY):
            urllib.request.urlopen(
                urllib.request.Request(
                    recorder + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
                )
            ).read()
        os.killpg(proc.pid, signal.SIGTERM)  # flushes the record
        proc.wait(timeout=15)
        port = _free_port()
        p = self.spawn(
            [
                sys.executable,
                "-m",
                "toolproxy.cli",
                "playback",
                "--from",
                PLAYED,
                "--data",
                str(data),
                "--port",
                str(port),
                "--match",
                "reuse=on",
            ]
        )
        self.roots[f"http://127.0.0.1:{port}"] = [p.pid]
        return f"http://127.0.0.1:{port}"

    def bare(self, upstream: str, processes: int = 1, use_uvloop: bool = True) -> str:
        """The bare aiohttp pass-through; several processes share the port as toolproxy's workers do.
        Without uvloop it is the floor: the plainest aiohttp proxy anyone would write."""
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        role = "bare" if use_uvloop else "bare_asyncio"
        self.roots[url] = [
            self.spawn([sys.executable, "-m", "benchmarks.proxy", role, str(port), upstream]).pid
            for _ in range(processes)
        ]
        return url

    def nginx_upstream(self, reply: bytes, connections: int = 4096) -> int | None:
        """nginx answering every request with `reply` (no streaming); its port, or None when nginx
        is not installed."""
        text = reply.decode().replace("\\", "\\\\").replace("'", "\\'")  # as an nginx single-quoted string
        return self._start_nginx("nginx-upstream", NGINX_UPSTREAM_CONF, connections, reply=text)

    def nginx(self, up_port: int, connections: int = 4096) -> str | None:
        """nginx proxy_pass with buffering off (Debian's `nginx`), or None when it is not installed."""
        port = self._start_nginx("nginx-proxy", NGINX_CONF, connections, up=up_port)
        return None if port is None else f"http://127.0.0.1:{port}"

    def _start_nginx(self, name: str, template: str, connections: int, **fields) -> int | None:
        """An nginx of `template` on a free port, its temporary files under a directory of its own; its port."""
        binary = nginx_binary()
        if binary is None:
            return None
        port = _free_port()
        temp = self.tmp / name
        for sub in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
            (temp / sub).mkdir(parents=True, exist_ok=True)
        conf = temp / "nginx.conf"
        conf.write_text(template.format(tmp=temp, port=port, conns=connections, nofile=connections * 2 + 64, **fields))
        self.roots[f"http://127.0.0.1:{port}"] = [self.spawn([binary, "-c", str(conf), "-g", "daemon off;"]).pid]
        return port

    def tree(self, url: str) -> list[int]:
        """Every process serving `url`: its roots and their children (workers, the classifier)."""
        return [pid for root in self.roots[url] for pid in process_tree(root)]

    def cpu_s(self, url: str) -> float:
        """CPU seconds used so far by everything serving `url` (workers and threads included)."""
        return cpu_seconds(self.tree(url))

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


FLOOR = "bare_aiohttp_asyncio"
PLAYED = "bench"  # the run the playback target serves


def pinned_cores() -> tuple[int, int] | None:
    """(the core the proxies and their upstream share, the core the load generator gets), or None
    when this process may run on fewer than two."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return (cores[0], cores[1]) if len(cores) >= 2 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="wrk duration per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--total", type=int, default=100_000, help="requests through toolproxy before the RSS reading")
    ap.add_argument("--ttfb-requests", type=int, default=200)
    ap.add_argument(
        "--c1-requests", type=int, default=2000, help="sequential requests per target per round for c1 latency"
    )
    ap.add_argument(
        "--workers",
        type=_int_list,
        default=[1],
        help="toolproxy --workers counts to measure, e.g. 1,2 "
        "(the bare pass-through runs as as many processes); the first must be 1",
    )
    ap.add_argument(
        "--layout",
        choices=("pinned", "free"),
        default="pinned",
        help="pinned (default): every proxy and its upstream on one core, the load generator on another; "
        "free: wherever the scheduler puts them (a proxy's writer thread may then have a core of its own)",
    )
    ap.add_argument(
        "--upstream",
        choices=("nginx", "fake"),
        default=None,
        help="what answers behind the proxies: nginx (the default where installed; no streaming, so no "
        "TTFB column) or the built-in fake (streams too)",
    )
    ap.add_argument("--no-nginx", action="store_true", help="leave nginx out as a proxy target even when installed")
    ap.add_argument("--json", dest="json_out", help="also write the raw numbers here")
    ap.add_argument(
        "--page-poll",
        type=float,
        default=None,
        metavar="SECONDS",
        help="also measure a toolproxy whose /_toolproxy/ page is open all along (its JSON polled this often)",
    )
    ap.add_argument(
        "--otlp",
        action="store_true",
        help="also measure toolproxy with --otlp-endpoint: to a receiver "
        "that takes every span, and to one that is down",
    )
    ap.add_argument(
        "--profile",
        type=float,
        default=None,
        metavar="SECONDS",
        help="after the rounds, sample toolproxy, toolproxy_no_page, bare_aiohttp and the floor with py-spy "
        "for this long each under c64 and print where each one's CPU per request goes",
    )
    ap.add_argument("--py-spy", default=None, help="the py-spy to use (default: on PATH; pip install py-spy)")
    ap.add_argument("_role", nargs="?", help=argparse.SUPPRESS)
    ap.add_argument("_port", nargs="?", type=int, help=argparse.SUPPRESS)
    ap.add_argument("_upstream", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._role == "upstream":
        _run_loop(_serve_upstream(args._port))
        return 0
    if args._role == "otlp_sink":
        _run_loop(_otlp_sink(), args._port)
        return 0
    if args._role in ("bare", "bare_asyncio"):
        _run_loop(_bare_app(args._upstream), args._port, use_uvloop=args._role == "bare")
        return 0
    if args.workers[0] != 1:
        ap.error("--workers: the first count must be 1 (the ratios compare single processes)")
    if not shutil.which("wrk"):
        print("benchmarks.proxy needs wrk (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    if args.profile is not None:
        args.py_spy = args.py_spy or shutil.which("py-spy")
        if args.py_spy is None:
            print(
                "benchmarks.proxy --profile needs py-spy (pip install py-spy; it is not a toolproxy dependency), "
                "or --py-spy PATH",
                file=sys.stderr,
            )
            return 2
    upstream_kind = args.upstream or ("nginx" if nginx_binary() else "fake")
    if upstream_kind == "nginx" and nginx_binary() is None:
        print("benchmarks.proxy: --upstream nginx needs nginx (Debian: apt-get install nginx)", file=sys.stderr)
        return 2
    cores = pinned_cores() if args.layout == "pinned" else None
    if args.layout == "pinned" and cores is None:
        print("benchmarks.proxy: --layout pinned needs two cores; measuring unpinned", file=sys.stderr)

    tmp = Path(tempfile.mkdtemp(prefix="toolproxy-bench-"))
    try:
        return _bench(args, tmp, upstream_kind, cores)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bench(args, tmp: Path, upstream_kind: str, cores: tuple[int, int] | None) -> int:
    script = tmp / "post.lua"
    script.write_text(
        "wrk.method = 'POST'\nwrk.headers['Content-Type'] = 'application/json'\n"
        f"wrk.headers['Authorization'] = 'Bearer sk-bench'\nwrk.body = [[{CHAT_BODY.decode()}]]\n"
    )
    everywhere = os.sched_getaffinity(0)
    if cores is not None:
        os.sched_setaffinity(0, {cores[0]})  # inherited by every process the fleet starts
    fleet = Fleet(tmp)
    try:
        if upstream_kind == "nginx":
            up_port = fleet.nginx_upstream(REPLY)
        else:
            up_port = fleet.upstream("benchmarks.proxy")
        upstream = f"http://127.0.0.1:{up_port}"
        targets = {"direct": upstream}
        tp = None
        for n in args.workers:
            name = "toolproxy" if n == 1 else f"toolproxy_w{n}"
            targets[name], proc = fleet.toolproxy(upstream, tmp / f"data-{name}", n)
            tp = tp or proc
        targets["toolproxy_no_page"] = fleet.toolproxy(upstream, tmp / "data-off", 1, "--no-live-page")[0]
        targets["playback"] = fleet.playback(upstream, tmp / "data-played")
        for n in args.workers:
            targets["bare_aiohttp" if n == 1 else f"bare_aiohttp_w{n}"] = fleet.bare(upstream, n)
        targets[FLOOR] = fleet.bare(upstream, 1, use_uvloop=False)
        if args.page_poll:
            targets["toolproxy_page_open"] = fleet.toolproxy(upstream, tmp / "data-page")[0]
        if args.otlp:
            sink = _free_port()
            fleet.spawn([sys.executable, "-m", "benchmarks.proxy", "otlp_sink", str(sink)])
            targets["toolproxy_otlp"] = fleet.toolproxy(
                upstream, tmp / "data-otlp", 1, "--otlp-endpoint", f"http://127.0.0.1:{sink}"
            )[0]
            targets["toolproxy_otlp_down"] = fleet.toolproxy(
                upstream, tmp / "data-otlp-down", 1, "--otlp-endpoint", f"http://127.0.0.1:{_free_port()}"
            )[0]
        if not args.no_nginx and (nginx := fleet.nginx(up_port)) is not None:
            targets["nginx"] = nginx
        os.sched_setaffinity(0, everywhere if cores is None else {cores[1]})  # the load generator's core
        measured = _measure(args, fleet, targets, tp, script, streams=upstream_kind == "fake")
        if args.profile is not None:
            measured["profiles"] = {
                name: _profile(args, fleet, targets[name], script)
                for name in ("toolproxy", "toolproxy_no_page", "bare_aiohttp", FLOOR)
            }
    finally:
        fleet.stop()
    print(_report(args, measured, upstream_kind, cores))
    if args.profile is not None:
        print(
            f"\nWhere the CPU per request goes: py-spy samples over {args.profile:g}s of c64 per target, each thread's "
            f"CPU split by its samples (benchmarks.profiling); load average {os.getloadavg()[0]:.1f}\n"
        )
        print(benchprofile.breakdown_table(measured["profiles"], FLOOR))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(measured, indent=2))
    return 0


def _measure(args, fleet: Fleet, targets: dict[str, str], tp: subprocess.Popen, script: Path, streams: bool) -> dict:
    """Every measurement of one run, as plain data: per target and round, and toolproxy's own counts."""
    path = "/v1/chat/completions"
    results: dict[str, dict[str, list[float]]] = {name: {} for name in targets}
    for url in targets.values():
        _wait_http(url)
    for url in targets.values():  # warm-up: connections, caches, JIT-free but allocator-warm
        _wrk(url + path, 16, 1, script)
    rss_warm = _rss_kb(tp.pid)
    page = _PagePoller(targets["toolproxy_page_open"], args.page_poll) if args.page_poll else None
    try:
        for rnd in range(args.rounds):
            c1_all = _c1_interleaved(targets, path, args.c1_requests)
            for name, url in targets.items():
                c1 = c1_all[name]
                cpu0 = fleet.cpu_s(url)
                c64 = _wrk(url + path, 64, args.seconds, script)
                cpu_per_req = (fleet.cpu_s(url) - cpu0) / max(c64["requests"], 1) * 1e6
                r = results[name]
                for key, val in (
                    ("c1_p50", c1["p50_us"]),
                    ("c1_p99", c1["p99_us"]),
                    ("c64_rps", c64["rps"]),
                    ("c64_p99", c64["p99_us"]),
                    ("c64_cpu_us", cpu_per_req),
                    ("errors", c1["non2xx"] + c64["non2xx"]),
                ):
                    r.setdefault(key, []).append(val)
                line = (
                    f"round {rnd + 1}/{args.rounds} {name}: c1 p50 {c1['p50_us']:.0f}us, c64 {c64['rps']:.0f} req/s "
                    f"({cpu_per_req:.0f} us CPU/req)"
                )
                if streams:
                    ttfb = statistics.median(asyncio.run(_ttfb(url + path, args.ttfb_requests)))
                    r.setdefault("ttfb_p50", []).append(ttfb)
                    line += f", ttfb p50 {ttfb:.0f}us"
                print(line, file=sys.stderr, flush=True)
        rss_trees = {name: rss_kb(fleet.tree(url)) for name, url in targets.items() if name != "direct"}
        stats = _stats(targets["toolproxy"])
        while stats["exchanges"] < args.total:
            _wrk(targets["toolproxy"] + path, 64, 5, script)
            stats = _stats(targets["toolproxy"])
        time.sleep(1.0)
        stats = _stats(targets["toolproxy"])
        rss_after = _rss_kb(tp.pid)
        otlp = {
            name: _stats(targets[name])["otlp"] for name in ("toolproxy_otlp", "toolproxy_otlp_down") if name in targets
        }
        data = fleet.tmp / "data-toolproxy"
        seg_bytes = sum(p.stat().st_size for p in (data / "segments").glob("*.jsonl"))
        views = {
            name: json.loads(urllib.request.urlopen(targets[name] + "/_toolproxy/live?limit=1").read())
            for name in ("toolproxy", "toolproxy_page_open")
            if name in targets
        }
    finally:
        if page is not None:
            page.stop()
    return {
        "medians": {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()},
        "raw": results,
        "rss_tree_kb": rss_trees,
        "rss_warm_kb": rss_warm,
        "rss_after_kb": rss_after,
        "segment_bytes": seg_bytes,
        "proxy_stats": stats,
        "otlp": otlp,
        "views": views,
        "load_average": os.getloadavg(),
    }


def _profile(args, fleet: Fleet, url: str, script: Path) -> dict[str, float]:
    """{part: CPU us per request} of the processes serving `url` under c64 (benchmarks.profiling)."""
    path = "/v1/chat/completions"
    pids = fleet.tree(url)
    cpu0 = benchprofile.thread_cpu(pids)
    load = subprocess.Popen(_wrk_command(url + path, 64, args.profile + 2, script), stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    raw = benchprofile.record(args.py_spy, fleet.roots[url][0], args.profile, fleet.tmp / "profile.txt")
    out, _ = load.communicate(timeout=args.profile + 60)
    cpu1 = benchprofile.thread_cpu(fleet.tree(url))
    cpu = {tid: (pid, comm, seconds - cpu0.get(tid, (0, "", 0.0))[2]) for tid, (pid, comm, seconds) in cpu1.items()}
    return benchprofile.attribute(
        benchprofile.read_samples(raw), cpu, _wrk_result(url, out)["requests"], set(fleet.roots[url])
    )


def _stats(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url + "/_toolproxy/stats").read())


def _report(args, measured: dict, upstream_kind: str, cores: tuple[int, int] | None) -> str:
    med, results, stats = measured["medians"], measured["raw"], measured["proxy_stats"]
    direct, floor = med["direct"], med[FLOOR]
    layout = (
        f"pinned: proxies and upstream on core {cores[0]}, wrk and the c1 client on core {cores[1]}"
        if cores is not None
        else "unpinned"
    )
    lines = [
        f"benchmarks.proxy: {args.rounds} interleaved rounds x {args.seconds:g}s per measurement, medians; {layout}; "
        f"upstream {upstream_kind}; request {len(CHAT_BODY):,} B; {os.cpu_count()} cores, load average "
        f"{measured['load_average'][0]:.1f} at the end; c1: {args.c1_requests} requests per target per round, targets "
        "taking turns request by request; c64: wrk on 127.0.0.1",
        "",
        "| target | c1 p50 (us) | added p50 (us) | c1 p99 (us) | c64 req/s | c64 p99 (us) | c64 CPU/req (us) | RSS of "
        "its processes (MiB) |"
        + (" stream TTFB p50 (us) | TTFB overhead (us) |" if "ttfb_p50" in direct else "")
        + " non-2xx |",
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if "ttfb_p50" in direct else "") + "---|",
    ]
    for name, m in med.items():
        rss = measured["rss_tree_kb"].get(name)
        row = (
            f"| {name} | {m['c1_p50']:.0f} | {m['c1_p50'] - direct['c1_p50']:.0f} | {m['c1_p99']:.0f} | "
            f"{m['c64_rps']:.0f} | "
            f"{m['c64_p99']:.0f} | {m['c64_cpu_us']:.0f} | {'-' if rss is None else f'{rss / 1024:.1f}'} |"
        )
        if "ttfb_p50" in direct:
            row += f" {m['ttfb_p50']:.0f} | {m['ttfb_p50'] - direct['ttfb_p50']:.0f} |"
        lines.append(row + f" {int(sum(results[name]['errors']))} |")

    added_floor = floor["c1_p50"] - direct["c1_p50"]
    lines += [
        "",
        f"Against the floor ({FLOOR}: the bare aiohttp pass-through without uvloop; target >= 1.0x):",
        "",
        "| target | c64 req/s vs floor | CPU/req: floor / target | added c1 p50: target / floor | RSS vs floor |",
        "|---|---|---|---|---|",
    ]
    rss_floor = measured["rss_tree_kb"][FLOOR]
    for name, m in med.items():
        if name in ("direct", FLOOR):
            continue
        added = m["c1_p50"] - direct["c1_p50"]
        lines.append(
            f"| {name} | {m['c64_rps'] / floor['c64_rps']:.2f}x | {floor['c64_cpu_us'] / m['c64_cpu_us']:.2f}x | "
            + (f"{added / added_floor:.2f}x" if added_floor > 0 else "n/a")
            + f" | {measured['rss_tree_kb'][name] / rss_floor:.2f}x |"
        )

    tpm, bare = med["toolproxy"], med["bare_aiohttp"]
    added_tp = tpm["c1_p50"] - direct["c1_p50"]
    added_bare = bare["c1_p50"] - direct["c1_p50"]
    written = stats["recording"]["written"]
    lines += [
        "",
        "| ratio (toolproxy vs bare aiohttp pass-through with uvloop) | value | target |",
        "|---|---|---|",
        f"| c64 throughput | {tpm['c64_rps'] / bare['c64_rps']:.2f}x | >= 1.0x |",
        "| c64 CPU per request (bare / toolproxy: throughput a free core would give) | "
        f"{bare['c64_cpu_us'] / tpm['c64_cpu_us']:.2f}x | >= 1.0x |",
        f"| added p50 latency at c1 | {added_tp / added_bare:.2f}x | <= 1.1x |"
        if added_bare > 0
        else "| added p50 latency at c1 | n/a | <= 1.1x |",
    ]
    if "ttfb_p50" in direct:
        lines.append(
            f"| stream TTFB overhead vs direct | {(tpm['ttfb_p50'] - direct['ttfb_p50']) / 1000:.2f} ms | < 2 ms |"
        )
    played = med["playback"]
    lines += [
        "| c1 p50 latency, playback (the recorded reply) vs serve (forwarding it) | "
        f"{played['c1_p50'] / tpm['c1_p50']:.2f}x | <= 1.0x |",
        f"| c64 throughput, playback vs serve | {played['c64_rps'] / tpm['c64_rps']:.2f}x | >= 1.0x |",
    ]
    off = med["toolproxy_no_page"]
    lines += [
        f"| RSS after warm-up -> after {stats['exchanges']} exchanges | {measured['rss_warm_kb'] / 1024:.1f} MiB -> "
        f"{measured['rss_after_kb'] / 1024:.1f} MiB | flat |",
        f"| bytes on disk per exchange | {measured['segment_bytes'] / max(written, 1):.0f} B | - |",
        f"| records written / dropped | {written} / {stats['recording']['dropped']} | all / 0 |",
        "| c64 throughput, live page on (classifier running) vs --no-live-page | "
        f"{tpm['c64_rps'] / off['c64_rps']:.2f}x | >= 0.95x |",
        "| RSS of the process tree, live page on vs --no-live-page | "
        f"{measured['rss_tree_kb']['toolproxy'] / 1024:.1f} MiB vs "
        f"{measured['rss_tree_kb']['toolproxy_no_page'] / 1024:.1f} MiB | - |",
    ]
    if args.page_poll:
        pg = med["toolproxy_page_open"]
        lines += [
            f"| c64 throughput, /_toolproxy/ page open (polled every {args.page_poll:g}s) vs closed | "
            f"{pg['c64_rps'] / tpm['c64_rps']:.2f}x | >= 0.95x |",
            f"| c1 p50 latency, page open vs closed | {pg['c1_p50'] / tpm['c1_p50']:.2f}x | <= 1.05x |",
        ]
    for name, v in measured["views"].items():
        lines.append(
            f"| {name}: exchanges classified / counted unclassified (classifier behind) | "
            f"{v['classified']} / {sum(v['unclassified'].values())} | - |"
        )
    otlp = measured["otlp"]
    if otlp:
        up, down = med["toolproxy_otlp"], med["toolproxy_otlp_down"]
        sent, lost = otlp["toolproxy_otlp"], otlp["toolproxy_otlp_down"]
        lines += [
            f"| c64 throughput, --otlp-endpoint (receiver up) vs without | {up['c64_rps'] / tpm['c64_rps']:.2f}x | >= "
            "0.9x |",
            f"| c64 CPU per request, without / with --otlp-endpoint | {tpm['c64_cpu_us'] / up['c64_cpu_us']:.2f}x "
            "| - |",
            f"| c1 p50 latency, --otlp-endpoint vs without | {up['c1_p50'] / tpm['c1_p50']:.2f}x | <= 1.05x |",
            f"| c64 throughput, receiver down vs without | {down['c64_rps'] / tpm['c64_rps']:.2f}x | >= 0.9x |",
            f"| spans exported / dropped / failed (receiver up) | {sent['exported']} / {sent['dropped']} / "
            f"{sent['failed']} of {sent['observed']} | - |",
            f"| spans exported / dropped / failed (receiver down) | {lost['exported']} / {lost['dropped']} / "
            f"{lost['failed']} of {lost['observed']} | - |",
        ]
    for n in args.workers[1:]:
        tpn, baren = med[f"toolproxy_w{n}"], med[f"bare_aiohttp_w{n}"]
        lines += [
            f"| c64 throughput, {n} workers vs 1 (toolproxy) | {tpn['c64_rps'] / tpm['c64_rps']:.2f}x | - |",
            f"| c64 throughput, {n} processes vs 1 (bare aiohttp) | {baren['c64_rps'] / bare['c64_rps']:.2f}x | - |",
            f"| c64 throughput, toolproxy vs bare, {n} processes each | {tpn['c64_rps'] / baren['c64_rps']:.2f}x | - |",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
