"""The playback server: any path the proxy serves, answered from the recording.

It listens like `serve` (tags in the path prefix or in X-Toolproxy-* headers, the same Host and
Origin check), but a request never reaches a model unless it misses and `--on-miss` says so. A
hit is sent as recorded: status, headers (secrets, which were redacted, left out), and the body
byte for byte, in one write (`--pace fast`) or piece by piece at the recorded offsets
(`--pace recorded`, from the recorder's piece marks; headers at the recorded time to first
byte). A recorded cut (upstream closed, timeout) is played as the same bytes and then a closed
connection, so a harness's handling of a broken stream is tested too. Each reply carries
`X-Toolproxy-Playback: <recorded exchange id>`.

On a miss, `fail` answers 404 with the closest recorded request and the first difference;
`forward` relays the request to `--upstream` and streams its answer back; `record` relays it
through a proxy started in-process on the data directory, so the new exchange is recorded into
the played run as any `serve` records it (the fixture grows itself, picked up next start).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from toolproxy import wire
from toolproxy.playback.fixture import RecordedExchange
from toolproxy.playback.match import Matcher, MatchRules, Miss
from toolproxy.proxy.errorbody import protocol_error_body
from toolproxy.proxy.exposure import Exposure
from toolproxy.proxy.tags import TAG_HEADER_PREFIX, header_tags, place_path_tags, tag_prefix
from toolproxy.wire.hopbyhop import HOP_BY_HOP, NOT_FORWARDED_UP, connection_listed

ON_MISS = ("fail", "forward", "record")
PACES = ("fast", "recorded")
MISS_STATUS = 404
# As `serve`'s default --max-body: a long agent history is megabytes (aiohttp's own read stops at 1 MiB).
MAX_BODY = 64 * 1024 * 1024
REPLY_HEADER = "X-Toolproxy-Playback"
STATS_PATH = "/_toolproxy/playback"
# aiohttp's client adds these when a request lacks them; a relayed request carries only the harness's.
_CLIENT_DEFAULTS = ("Accept", "Accept-Encoding", "User-Agent")


@dataclass
class PlaybackOptions:
    run: str
    on_miss: str = "fail"
    upstream: str | None = None
    pace: str = "fast"
    host: str = "127.0.0.1"
    port: int = 0
    allowed_hosts: tuple[str, ...] = ()
    data_dir: Path = Path("toolproxy-data")
    # Called with each miss's message (the CLI prints it).
    on_missed: Callable[[str], None] | None = None


@dataclass
class PlaybackStats:
    recorded: int
    played: int = 0
    missed: int = 0
    relayed: int = 0
    refused: Counter = field(default_factory=Counter)

    used: int = 0  # recorded exchanges that answered at least once

    def as_dict(self) -> dict:
        return {
            "recorded": self.recorded,
            "played": self.played,
            "used": self.used,
            "unused": self.recorded - self.used,
            "missed": self.missed,
            "relayed": self.relayed,
            "refused": dict(self.refused),
        }

    def line(self) -> str:
        again = f" ({self.played - self.used} replayed again, --match reuse=on)" if self.played > self.used else ""
        return f"played {self.used} of {self.recorded} recorded exchanges{again}, {self.missed} misses" + (
            f" ({self.relayed} relayed upstream)" if self.relayed else ""
        )


class Playback:
    """The handler's state: the matcher, the relay for misses, the counts."""

    def __init__(self, exchanges: list[RecordedExchange], rules: MatchRules, options: PlaybackOptions) -> None:
        if options.on_miss not in ON_MISS:
            raise ValueError(f"--on-miss must be one of {', '.join(ON_MISS)}")
        if options.pace not in PACES:
            raise ValueError(f"--pace must be one of {', '.join(PACES)}")
        if options.on_miss != "fail" and not options.upstream:
            raise ValueError(f"--on-miss {options.on_miss} needs --upstream URL (where a miss is sent)")
        self.matcher = Matcher(exchanges, rules)
        self.options = options
        self.exposure = Exposure(options.host, options.allowed_hosts)
        self.stats = PlaybackStats(recorded=len(exchanges))
        self.session: aiohttp.ClientSession | None = None
        self.relay_base: str | None = None  # where misses go: the upstream, or the recording proxy

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        refused = self.exposure.refusal(request.method, request.headers)
        if refused is not None:
            self.stats.refused[refused[0]] += 1
            return _error(403, refused[2], refused[1], path=request.path)
        path, _, query = request.raw_path.partition("?")
        if path == STATS_PATH:
            return web.json_response(self.stats.as_dict())
        tags, path, _ = place_path_tags(path)  # a misplaced prefix stays in the path: a miss naming it
        tags.update(header_tags(request.headers.items()))
        body = bytearray()
        async for piece in request.content.iter_any():
            body += piece
            if len(body) > MAX_BODY:
                return _error(
                    413,
                    f"request body is larger than playback's limit of {MAX_BODY} bytes",
                    "request_too_large",
                    path=path,
                )
        body = bytes(body)
        found = self.matcher.take(request.method, path, query, body, tags.get("episode"))
        if isinstance(found, Miss):
            self.stats.missed += 1
            if self.relay_base is None:
                message = found.message()
                if self.options.on_missed is not None:
                    self.options.on_missed(message)
                return _error(MISS_STATUS, message, "playback_miss", miss=True, path=path)
            return await self._relay(request, tags, path, query, body)
        self.stats.played += 1
        self.stats.used = len(self.matcher.used)
        return await self._play(request, found)

    async def _play(self, request: web.BaseRequest, x: RecordedExchange) -> web.StreamResponse:
        started = time.perf_counter()
        recorded = self.options.pace == "recorded"
        if recorded and x.ttfb_ms:
            await asyncio.sleep(x.ttfb_ms / 1000.0)
        drop = HOP_BY_HOP | connection_listed(x.headers)
        headers = CIMultiDict((k, v) for k, v in x.headers if k.lower() not in drop and not v.startswith("redacted:"))
        headers[REPLY_HEADER] = x.id
        resp = web.StreamResponse(status=x.status, headers=headers)
        await resp.prepare(request)
        body = x.body
        if recorded and x.pieces:
            sent = 0
            for end, ms in x.pieces:
                end = min(int(end), len(body))
                wait = ms / 1000.0 - (time.perf_counter() - started)
                if wait > 0:
                    await asyncio.sleep(wait)
                if end > sent:
                    await resp.write(body[sent:end])
                    sent = end
            body = body[sent:]
        if body:
            await resp.write(body)
        if x.cut:
            request.transport.close()  # the bytes written go out, then FIN: no end of body
            raise asyncio.CancelledError  # aiohttp drops a cancelled handler without writing more
        await resp.write_eof()
        return resp

    async def _relay(
        self, request: web.BaseRequest, tags: dict[str, str], path: str, query: str, body: bytes
    ) -> web.StreamResponse:
        """The request sent on (to the upstream, or tagged for the run through the recording
        proxy), its answer streamed back as it comes."""
        self.stats.relayed += 1
        if self.options.on_miss == "record":
            tags = {k: v for k, v in tags.items() if k != "run"}
            target = self.relay_base + tag_prefix(self.options.run, tags.pop("condition", None), **tags) + path
        else:
            target = self.relay_base + path
        drop = NOT_FORWARDED_UP | connection_listed(request.headers.items())
        headers = [
            (k, v)
            for k, v in request.headers.items()
            if k.lower() not in drop and not k.lower().startswith(TAG_HEADER_PREFIX)
        ]
        try:
            upstream = await self.session.request(
                request.method,
                target + (f"?{query}" if query else ""),
                headers=headers,
                data=body or None,
                allow_redirects=False,
            )
        except aiohttp.ClientError as exc:
            return _error(
                502,
                f"toolproxy playback: the miss could not be sent to {self.options.upstream}: {exc}",
                "upstream_unreachable",
                path=path,
            )
        try:
            raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream.raw_headers]
            down = HOP_BY_HOP | connection_listed(raw)
            resp = web.StreamResponse(
                status=upstream.status,
                reason=upstream.reason,
                headers=CIMultiDict((k, v) for k, v in raw if k.lower() not in down),
            )
            await resp.prepare(request)
            try:
                async for piece in upstream.content.iter_any():
                    await resp.write(piece)
            except aiohttp.ClientError:
                request.transport.close()
                raise asyncio.CancelledError from None
            await resp.write_eof()
            return resp
        finally:
            upstream.close()


def _error(status: int, message: str, code: str, miss: bool = False, path: str = "") -> web.Response:
    """Playback's own answer, in the error shape the protocol's clients read (as serve's are)."""
    headers = {REPLY_HEADER: "miss"} if miss else None
    return web.Response(
        status=status,
        body=protocol_error_body(wire.family_of(path), message, code),
        content_type="application/json",
        headers=headers,
    )


@dataclass
class RunningPlayback:
    playback: Playback
    runner: web.ServerRunner
    recording: object | None = None  # the in-process proxy of --on-miss record
    port: int = 0  # where it listens, once it does
    url: str = ""

    @property
    def stats(self) -> PlaybackStats:
        return self.playback.stats

    async def stop(self) -> None:
        await self.runner.cleanup()
        if self.playback.session is not None:
            await self.playback.session.close()
        if self.recording is not None:
            await self.recording.stop()  # flushes the recorded misses


class CannotPlay(Exception):
    """The server could not start (address taken, the recording proxy failed); the message says why."""


async def start_playback(
    exchanges: list[RecordedExchange], rules: MatchRules, options: PlaybackOptions
) -> RunningPlayback:
    """The playback server listening on this loop (and, for --on-miss record, its recording proxy)."""
    playback = Playback(exchanges, rules, options)
    recording = None
    if options.on_miss == "record":
        from toolproxy.proxy.config import ProxyConfig
        from toolproxy.proxy.server import CannotListen, start_proxy

        config = ProxyConfig(
            upstream=options.upstream, data_dir=options.data_dir, port=0, run=options.run, quiet=True, live_page=False
        )
        try:
            recording = await start_proxy(config)
        except CannotListen as exc:
            raise CannotPlay(f"the recording proxy for --on-miss record could not start: {exc}") from None
        playback.relay_base = recording.url
    elif options.on_miss == "forward":
        playback.relay_base = options.upstream.rstrip("/")
    if playback.relay_base is not None:
        playback.session = aiohttp.ClientSession(
            auto_decompress=False,
            skip_auto_headers=_CLIENT_DEFAULTS,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
    server = web.Server(playback.handle, handler_cancellation=True, access_log=None, auto_decompress=False)
    runner = web.ServerRunner(server)
    await runner.setup()
    running = RunningPlayback(playback, runner, recording)
    try:
        await web.TCPSite(runner, options.host, options.port, reuse_address=True).start()
    except OSError as exc:
        await running.stop()
        raise CannotPlay(f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}") from None
    running.port = runner.addresses[0][1]
    host = f"[{options.host}]" if ":" in options.host else options.host
    running.url = f"http://{host}:{running.port}"
    return running
