"""Whether the upstream answers, for /_toolproxy/health: apart from whether recording works.

The evidence is what the proxy already learns, newest wins: a fingerprint (StackWatch reports each
one here), an exchange that could not connect (this addon's `error` hook, which runs only for
failed exchanges, so a forwarded request pays nothing), and, when all of that is older than
`INTERVAL` seconds, a probe of its own made when someone asks (never unasked: under
--no-fingerprint an idle proxy sends the upstream nothing). The probe is one GET of the
upstream's root on a session of its own (never a pooled upstream connection, so a busy pool
neither delays it nor counts it); any HTTP answer, even a 404, means reachable. At most one
probe runs at a time and at most one starts per INTERVAL, so a load balancer polling health every
second costs the upstream one request every INTERVAL seconds. A caller waits for a probe at most
WAIT seconds (on the loop, never blocking it); past that it gets the previous evidence, marked
`checking`, and the probe finishes in the background for the next caller.

`since` is when the current answer (reachable or not) was first seen: the live page says
"unreachable since 14:02", which a single check time cannot tell.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from toolproxy.proxy.flow import Addon, Flow, Service
from toolproxy.stacks.fingerprint import USER_AGENT
from toolproxy.term.connection_errors import explain

INTERVAL = 10.0
WAIT = 1.0
PROBE_TIMEOUT = 5.0


def _connect_failure(flow: Flow) -> bool:
    rec = flow.rec
    return rec.error_kind == "connect" or (rec.error_kind == "timeout" and rec.extra.get("timeout_phase") == "connect")


def _nothing() -> None: ...


def _session(timeout: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout),
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"User-Agent": USER_AGENT},
    )


async def why_unanswered(session: aiohttp.ClientSession, upstream: str) -> str | None:
    """None when the upstream answers HTTP at all (any status, a 404 or a 401 included), else why
    not, in words a user can act on: the probe the health route makes, one GET of its root."""
    try:
        async with session.get(upstream.rstrip("/") + "/", allow_redirects=False):
            return None  # any answer will do; the body is never read
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return explain(exc, upstream).sentence()


async def check_upstream(upstream: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """`why_unanswered` on a session of its own: what `run` and `study` ask before a harness starts,
    so a wrong port costs one line, not a study of connect errors."""
    async with _session(timeout) as session:
        return await why_unanswered(session, upstream)


class UpstreamHealth(Addon):
    def __init__(self, upstream: str, connect_timeout: float, interval: float = INTERVAL, wait: float = WAIT) -> None:
        self.upstream = upstream
        self.timeout = min(connect_timeout, PROBE_TIMEOUT)
        self.interval = interval
        self.wait = wait
        self.reachable: bool | None = None
        self.last_error: str | None = None
        self.checked_at: float | None = None  # wall clock, for people
        self.since: float | None = None  # wall clock of the first observation of the current `reachable`
        self.source: str | None = None  # probe | fingerprint | exchange
        self._checked_mono: float | None = None  # monotonic, for the interval
        self._started_mono: float | None = None  # the last probe's start
        self._probe: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    def observe(self, reachable: bool, error: str | None, source: str) -> None:
        now = time.time()
        if reachable != self.reachable:
            self.since = now
        self.reachable, self.last_error, self.source = reachable, None if reachable else error, source
        self.checked_at, self._checked_mono = now, time.monotonic()

    def service(self) -> Service:
        """Nothing to start (it probes when asked); its probe and session stop with the proxy."""
        return Service("upstream health", _nothing, self.stop)

    def error(self, flow: Flow) -> None:
        if _connect_failure(flow):
            self.observe(False, flow.rec.error_message, "exchange")

    def _stale(self) -> bool:
        latest = max((t for t in (self._checked_mono, self._started_mono) if t is not None), default=None)
        return latest is None or time.monotonic() - latest >= self.interval

    def start(self) -> None:
        """Probe now, in the background."""
        if self._probe is None or self._probe.done():
            self.track(asyncio.get_running_loop().create_task(self._run(), name="toolproxy-upstream-health"))

    def track(self, task: asyncio.Task) -> None:
        """A probe under way whose end brings evidence (a fingerprint's): callers wait for it as for our own."""
        self._started_mono = time.monotonic()
        self._probe = task

    async def report(self) -> dict:
        """The evidence as the health route shows it, refreshed first when it is stale."""
        if self._stale():
            self.start()
        if self._probe is not None and not self._probe.done():
            await asyncio.wait([self._probe], timeout=self.wait)
        checking = self._probe is not None and not self._probe.done()
        return {
            "url": self.upstream,
            "reachable": self.reachable,
            "error": self.last_error,
            "checked_at": self.checked_at,
            "since": self.since,
            "age_s": round(time.monotonic() - self._checked_mono, 3) if self._checked_mono is not None else None,
            "source": self.source,
            "checking": checking,
        }

    async def _run(self) -> None:
        if self._session is None:
            self._session = _session(self.timeout)
        problem = await why_unanswered(self._session, self.upstream)
        if problem is None:
            self.observe(True, None, "probe")
        else:
            self.observe(False, f"cannot reach {self.upstream}: {problem}", "probe")

    async def stop(self) -> None:
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
