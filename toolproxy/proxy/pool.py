"""The upstream connection pool: as many connections as clients by default, a flag to cap it.

A cap is a queue, and a queue the operator cannot see makes the upstream look slow: so with a
cap (`--upstream-connections N`), the time each request waits for a free connection is measured
(aiohttp's connection-queue trace signals), stored in its record as `pool_wait_ms` apart from
`ttfb_ms`, and summed in the stats. Without a cap there is no queue, nothing to measure, and no
tracing cost on the hot path.
"""

from __future__ import annotations

import time
import weakref
from contextvars import ContextVar
from types import SimpleNamespace

import aiohttp

from toolproxy.proxy.flow import Addon, Flow

# Idle pooled connections are dropped after this long, before the upstream drops them: llama.cpp's
# server (cpp-httplib) closes a connection idle for 5 s (measured on llama-server 0c1e570), as
# uvicorn (vLLM, SGLang) and Node do by default. aiohttp's default, 15 s, hands out connections
# the upstream may be closing at that very moment.
KEEPALIVE_S = 4.0

# For the exchange in hand (its task's context): whether its upstream connection had served an
# earlier request, and when it was handed over (see forward._send).
CONNECTION: ContextVar[tuple[bool, float] | None] = ContextVar("toolproxy_upstream_connection", default=None)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, noting in CONNECTION whether each connection it hands out is reused."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._served: weakref.WeakSet = weakref.WeakSet()

    async def connect(self, req, traces, timeout):
        conn = await super().connect(req, traces, timeout)
        protocol = conn.protocol
        reused = protocol in self._served
        if not reused:
            self._served.add(protocol)
        CONNECTION.set((reused, time.monotonic()))
        return conn


class PoolStats(Addon):
    """The pool's counters, and (as an addon) the settling of a wait that ended in an error.

    aiohttp signals the end of a wait only when a connection was obtained: a request cancelled
    while queued (timeout, client gone) is settled by the error hook instead, so `waiting_now`
    never drifts and the record still shows how long it waited.
    """

    stats_key = "upstream_pool"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.hooked = bool(limit)  # uncapped, nothing waits: only its (zero) counts are shown
        self.waited = 0
        self.waiting = 0
        self.wait_ms_total = 0.0
        self.wait_ms_max = 0.0

    def report(self) -> dict:
        return {
            "limit": self.limit or None,
            "waiting_now": self.waiting,
            "requests_waited": self.waited,
            "wait_ms_total": round(self.wait_ms_total, 3),
            "wait_ms_max": round(self.wait_ms_max, 3),
        }

    def trace_config(self) -> aiohttp.TraceConfig:
        """Signals that time a request's wait for a pooled connection into its flow's pool_wait."""
        trace = aiohttp.TraceConfig()

        async def queued(session, ctx: SimpleNamespace, params) -> None:
            flow = ctx.trace_request_ctx
            if flow is not None:
                flow.pool_queued_at = time.perf_counter()
                self.waiting += 1

        async def dequeued(session, ctx: SimpleNamespace, params) -> None:
            if ctx.trace_request_ctx is not None:
                self._settle(ctx.trace_request_ctx)

        trace.on_connection_queued_start.append(queued)
        trace.on_connection_queued_end.append(dequeued)
        return trace

    def _settle(self, flow: Flow) -> None:
        ms = (time.perf_counter() - flow.pool_queued_at) * 1000.0
        flow.pool_queued_at = None
        flow.pool_wait = (flow.pool_wait or 0.0) + ms
        self.waiting -= 1
        self.waited += 1
        self.wait_ms_total += ms
        self.wait_ms_max = max(self.wait_ms_max, ms)

    def error(self, flow: Flow) -> None:
        if flow.pool_queued_at is not None:
            self._settle(flow)


def upstream_session(pool: PoolStats, connect_timeout: float) -> aiohttp.ClientSession:
    """The one session every exchange and probe shares; it forwards bytes as they are."""
    return aiohttp.ClientSession(
        connector=_Connector(limit=pool.limit, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_S),
        # sock_connect, not connect: aiohttp's connect timeout includes the wait for a pooled
        # connection, which is queueing (timed by --ttfb-timeout), not the upstream failing to answer.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=None),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=[pool.trace_config()] if pool.limit else None,
    )
