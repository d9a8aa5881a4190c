"""The aiohttp application: one pooled upstream session, one writer, live counters, admin routes."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import Counter
from typing import Callable

import aiohttp
from aiohttp import web

from toolproxy import __version__
from toolproxy.proxy import livepage
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.forward import ADMIN_PREFIX, STATE, handle
from toolproxy.proxy.live import LiveView
from toolproxy.proxy.stackwatch import StackWatch
from toolproxy.proxy.watchdog import Watchdog
from toolproxy.record.model import Record
from toolproxy.record.writer import SegmentWriter


def log_line(rec: Record) -> str:
    """The one line `serve` prints per exchange (built on the writer thread, not the loop)."""
    status = rec.client_status if rec.client_status is not None else rec.status
    tags = " ".join(f"{k}={v}" for k, v in (("run", rec.run), ("ep", rec.episode), ("item", rec.item)) if v)
    cond = f" [{rec.condition}]" if rec.condition != "native" else ""
    err = f" !{rec.error_kind}" if rec.error_kind else ""
    ms = f"{rec.duration_ms:.0f}ms" if rec.duration_ms is not None else "-"
    return f"{status or '---'} {rec.method} {rec.path}{cond} {tags} {ms}{err}".replace("  ", " ")


class ProxyState:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.live = LiveView() if config.live_page else None
        self.writer = SegmentWriter(
            config.data_dir,
            window=config.commit_window,
            max_queue=config.max_queue,
            segment_bytes=config.segment_bytes,
            segment_seconds=config.segment_seconds,
            log=None if config.quiet else log_line,
            observe=self.live.observe if self.live is not None else None,
        )
        self.session: aiohttp.ClientSession | None = None
        self.watchdog = Watchdog()
        self.started = time.time()
        self.in_flight = 0
        self.by_class: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.total = 0
        self.stacks: StackWatch | None = None
        # Called with every finished record on the loop; each must be as cheap as an append.
        self.listeners: list[Callable[[Record], None]] = []

    def count(self, rec: Record) -> None:
        self.total += 1
        status = rec.client_status if rec.client_status is not None else rec.status
        self.by_class[f"{status // 100}xx" if status else "none"] += 1
        if rec.error_kind:
            self.errors[rec.error_kind] += 1
        for listener in self.listeners:
            listener(rec)

    def snapshot(self) -> dict:
        w = self.writer.stats
        return {
            "status": "degraded" if w.degraded else "ok",
            "version": __version__,
            "upstream": self.config.upstream,
            "data_dir": str(self.config.data_dir),
            "condition": self.config.condition,
            "stack": self.stacks.summary() if self.stacks is not None else None,
            "uptime_s": round(time.time() - self.started, 3),
            "exchanges": self.total,
            "in_flight": self.in_flight,
            "by_status_class": dict(self.by_class),
            "errors": dict(self.errors),
            "recording": {
                "queue_depth": self.writer.queue_depth,
                "written": w.written,
                "dropped": w.dropped,
                "dropped_reasons": dict(w.dropped_reasons),
                "behind": self.writer.behind,
                "write_failures": w.write_failures,
                "segments": w.segments,
                "last_error": w.last_error,
                "durability": self.config.durability,
                "on_record_failure": self.config.on_record_failure,
            },
        }

    async def admin(self, request: web.Request) -> web.Response:
        """Reserved routes; never forwarded upstream and never recorded as exchanges."""
        name = request.path[len(ADMIN_PREFIX):].strip("/")
        if self.live is not None:
            page = await livepage.route(request, name, self.live, self.config.auth_token)
            if page is not None:
                return page
        if name in ("health", "stats", ""):
            snap = self.snapshot()
            status = 200 if (name != "health" or snap["status"] == "ok") else 503
            return web.json_response(snap, status=status)
        return web.json_response({"error": {"message": f"no admin route {request.path!r}; try {ADMIN_PREFIX}health"}}, status=404)


def make_app(config: ProxyConfig) -> web.Application:
    app = web.Application(client_max_size=config.max_body)
    state = ProxyState(config)
    app[STATE] = state

    async def on_startup(app: web.Application) -> None:
        state.writer.start()
        if state.live is not None:
            state.live.start()
        state.watchdog.start()
        state.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=config.max_connections, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, connect=config.connect_timeout, sock_read=None),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        if config.fingerprint:
            # In the background: serving starts now, whatever the upstream is doing.
            state.stacks = StackWatch(state)
            state.listeners.append(state.stacks.observe)
            state.stacks.start()

    async def on_cleanup(app: web.Application) -> None:
        if state.stacks is not None:
            await state.stacks.stop()
        await state.watchdog.stop()
        if state.session is not None:
            await state.session.close()
        await asyncio.get_running_loop().run_in_executor(None, state.writer.close)
        if state.live is not None:
            state.live.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def serve(config: ProxyConfig) -> None:
    """Run until SIGINT/SIGTERM; prints where it listens and where it records."""
    app = make_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(f"toolproxy: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    host = f"[{config.host}]" if ":" in config.host else config.host
    port = runner.addresses[0][1] if runner.addresses else config.port
    print(
        f"toolproxy {__version__}: listening on http://{host}:{port} -> upstream {config.upstream}; "
        f"recording to {config.data_dir.resolve()} (condition {config.condition}, durability {config.durability})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await stop.wait()
    finally:
        print("toolproxy: shutting down, flushing records", file=sys.stderr, flush=True)
        await runner.cleanup()


def run(config: ProxyConfig) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
