"""The playback server: any path the proxy serves, answered from the recording.

It listens as `serve` does, through the same code: the same listener (request-head timeout, line
limits, aiohttp's parse errors logged as one redacted line: `proxy.listener`), the same Host and
Origin check (`proxy.exposure`), the same refusal of a target that is not a path
(`proxy.admission`: it would name another server), the same tags (path prefix or X-Toolproxy-*
headers, `proxy.tags`), the same body limit and the same wait for a slow body. A request never
reaches a model unless it misses and `--on-miss` says so. A hit is sent as recorded: status,
headers (secrets, which were redacted, left out), and the body byte for byte, in one write
(`--pace fast`) or piece by piece at the recorded offsets (`--pace recorded`, from the
recorder's piece marks; headers at the recorded time to first byte; no wait longer than serve's
own timeouts would have let one be). A recorded cut (upstream closed, timeout) is played as the
same bytes and then a closed connection, so a harness's handling of a broken stream is tested
too. Each reply carries `X-Toolproxy-Playback: <recorded exchange id>`.

On a miss, `fail` answers 404 with the closest recorded request and the first difference;
`forward` relays the request to `--upstream` and streams its answer back; `record` relays it
through a proxy started in-process on the data directory (tags as the client sent them, the run
as the played one), so the new exchange is recorded into the played run as any `serve` records
it (the fixture grows itself, picked up next start). What `serve` would record without
forwarding (a body over the limit, tags after a misplaced `/v1`) goes to that proxy too under
`record`, which records it as serve does; otherwise playback answers it itself. Refused
requests are counted by kind (`refused` in the stats); playback writes no record of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from toolproxy import wire
from toolproxy.playback.fixture import REPLY_HEADER, Fixture, RecordedExchange
from toolproxy.playback.match import Matcher, MatchRules, Miss
from toolproxy.proxy.admission import origin_form_refusal
from toolproxy.proxy.config import (
    CLIENT_BODY_TIMEOUT,
    CLIENT_HEADER_TIMEOUT,
    IDLE_TIMEOUT,
    MAX_BODY,
    TTFB_TIMEOUT,
    ConfigError,
    ProxyConfig,
)
from toolproxy.proxy.errorbody import protocol_error_body
from toolproxy.proxy.exposure import Exposure
from toolproxy.proxy.flow import Refusal
from toolproxy.proxy.headers import load_redactor
from toolproxy.proxy.listener import CannotListen, listen
from toolproxy.proxy.refusals import PARSER_REJECTED
from toolproxy.proxy.tags import TAG_HEADER_PREFIX, header_tags, misplaced_refusal, place_path_tags
from toolproxy.term.printable import printable
from toolproxy.wire import jsonrpc
from toolproxy.wire.hopbyhop import HOP_BY_HOP, NOT_FORWARDED_UP, connection_listed

ON_MISS = ("fail", "forward", "record")
PACES = ("fast", "recorded")
MISS_STATUS = 404
STATS_PATH = "/_toolproxy/playback"
RUN_HEADER = TAG_HEADER_PREFIX + "run"
# The tag that names the recorded MCP server an HTTP request is for (`/t/mcp_server=NAME/mcp`).
MCP_SERVER_TAG = "mcp_server"
# aiohttp's client adds these when a request lacks them; a relayed request carries only the harness's.
_CLIENT_DEFAULTS = ("Accept", "Accept-Encoding", "User-Agent")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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
    # Requests answered without the recording, by kind (serve's words: host_refused, body_too_large...).
    refused: Counter = field(default_factory=Counter)
    # Lines of the data directory not played, by kind (fixture.Fixture.set_aside).
    set_aside: dict[str, int] = field(default_factory=dict)

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
            "set_aside": dict(self.set_aside),
        }

    def line(self) -> str:
        again = f" ({self.played - self.used} replayed again, --match reuse=on)" if self.played > self.used else ""
        refused = ", ".join(f"{k} {v}" for k, v in sorted(self.refused.items()))
        set_aside = ", ".join(f"{k} {v}" for k, v in sorted(self.set_aside.items()))
        return (
            f"played {self.used} of {self.recorded} recorded exchanges{again}, {self.missed} misses"
            + (f" ({self.relayed} relayed upstream)" if self.relayed else "")
            + (f"; refused {sum(self.refused.values())} ({refused})" if refused else "")
            + (f"; set aside {sum(self.set_aside.values())} lines ({set_aside})" if set_aside else "")
        )


class Playback:
    """The handler's state: the matcher, the relay for misses, the counts."""

    def __init__(self, fixture: Fixture, rules: MatchRules, options: PlaybackOptions) -> None:
        if options.on_miss not in ON_MISS:
            raise ValueError(f"--on-miss must be one of {', '.join(ON_MISS)}")
        if options.pace not in PACES:
            raise ValueError(f"--pace must be one of {', '.join(PACES)}")
        if options.on_miss != "fail" and not options.upstream:
            raise ValueError(f"--on-miss {options.on_miss} needs --upstream URL (where a miss is sent)")
        self.matcher = Matcher(fixture.exchanges, rules)
        self.options = options
        self.exposure = Exposure(options.host, options.allowed_hosts)
        self.stats = PlaybackStats(recorded=len(fixture.exchanges), set_aside=fixture.set_aside_counts())
        self.destination = (
            f"its configured upstream ({options.upstream})"
            if options.upstream
            else "nowhere: playback answers from its recording"
        )
        self.session: aiohttp.ClientSession | None = None
        self.relay_base: str | None = None  # where misses go: the upstream, or the recording proxy
        self.recording = options.on_miss == "record"

    def rejected(self, status: int, exc: BaseException) -> None:
        """aiohttp's parser rejected a request (the listener logged it, redacted): counted."""
        self.stats.refused[PARSER_REJECTED] += 1

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except asyncio.CancelledError:
            raise  # the client went away, or a cut reply was closed on purpose
        except ConnectionError:  # the client went away while we wrote: nothing to answer, nothing to log
            if request.transport is not None:
                request.transport.close()
            raise asyncio.CancelledError from None
        except Exception as exc:  # a bug must still get a clear answer and one line, never a traceback
            return _error(500, self._failed(exc), "playback_error", path=request.path)

    def _failed(self, exc: Exception) -> str:
        self.stats.refused["playback_error"] += 1
        message = f"toolproxy playback: internal error: {type(exc).__name__}: {exc}"
        print(printable(message), file=sys.stderr, flush=True)
        return message

    @contextlib.asynccontextmanager
    async def _sending(self, request: web.BaseRequest) -> AsyncIterator[None]:
        """Around what is sent after the status line: a failure there can only close the
        connection (said in one line, as handle says any other)."""
        try:
            yield
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:
            self._failed(exc)
            if request.transport is not None:
                request.transport.close()
            raise asyncio.CancelledError from None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        refused = self.exposure.refusal(request.method, request.headers)
        if refused is not None:
            return self._refuse(Refusal(403, refused[0], refused[2], refused[1]), request.path)
        raw_path, _, query = request.raw_path.partition("?")
        if raw_path == STATS_PATH:
            return web.json_response(self.stats.as_dict())
        tags, path, misplaced = place_path_tags(raw_path)
        refusal = origin_form_refusal(path, self.destination)
        if refusal is not None:
            return self._refuse(refusal, path)
        if misplaced is not None:
            if self.recording:
                return await self._relay(request, raw_path, query, b"", request.content)
            asked = path + (f"?{query}" if query else "")
            return self._refuse(misplaced_refusal(request.host, misplaced, asked, wire.family_of(path)), path)
        tags.update(header_tags(request.headers.items()))
        body = await self._read_body(request, path)
        if not isinstance(body, bytes):
            return body
        server = tags.get(MCP_SERVER_TAG)
        found = self.matcher.take(request.method, path, query, body, tags.get("episode"), server)
        if isinstance(found, Miss):
            self.stats.missed += 1
            if self.relay_base is None:
                message = found.message()
                if self.options.on_missed is not None:
                    self.options.on_missed(message)
                return _error(MISS_STATUS, message, "playback_miss", miss=True, path=path)
            return await self._relay(request, raw_path if self.recording else path, query, body)
        self.stats.played += 1
        self.stats.used = len(self.matcher.used)
        return await self._play(request, found, answered_id(found, body))

    def _refuse(self, refusal: Refusal, path: str) -> web.Response:
        self.stats.refused[refusal.kind] += 1
        return _error(refusal.status, refusal.message, refusal.code, path=path, family=refusal.family)

    async def _read_body(self, request: web.BaseRequest, path: str) -> bytes | web.StreamResponse:
        """The request body, with serve's limit (MAX_BODY) and its wait for a pause in it
        (CLIENT_BODY_TIMEOUT); or the answer when it breaks either. A body over the limit goes to
        the recording proxy under --on-miss record, which records it as serve does."""
        if request.content_length is not None and request.content_length > MAX_BODY:
            return await self._too_large(request, path, b"")
        body = bytearray()
        while True:
            try:
                async with asyncio.timeout(CLIENT_BODY_TIMEOUT):
                    piece = await request.content.readany()
            except TimeoutError:
                self.stats.refused["client_timeout"] += 1
                return _error(
                    408,
                    f"the client sent its request body too slowly: nothing for {CLIENT_BODY_TIMEOUT:g}s",
                    "request_timeout",
                    path=path,
                    close=True,
                )
            if not piece:
                return bytes(body)
            body += piece
            if len(body) > MAX_BODY:
                return await self._too_large(request, path, bytes(body))

    async def _too_large(self, request: web.BaseRequest, path: str, read: bytes) -> web.StreamResponse:
        self.stats.refused["body_too_large"] += 1
        if self.recording:
            return await self._relay(
                request, request.raw_path.partition("?")[0], request.raw_path.partition("?")[2], read, request.content
            )
        return _error(
            413,
            f"request body is larger than playback's limit of {MAX_BODY} bytes",
            "request_too_large",
            path=path,
            close=True,
        )

    async def _play(
        self, request: web.BaseRequest, x: RecordedExchange, body: bytes | None = None
    ) -> web.StreamResponse:
        """`body`: the reply's body when it is not the recorded one (an MCP reply to another id)."""
        started = time.perf_counter()
        first_byte, pieces = schedule(x) if self.options.pace == "recorded" and body is None else (0.0, [])
        if first_byte:
            await asyncio.sleep(first_byte)
        drop = HOP_BY_HOP | connection_listed(x.headers)
        if body is not None:
            drop = drop | {"content-length"}
        headers = CIMultiDict((k, v) for k, v in x.headers if k.lower() not in drop and not v.startswith("redacted:"))
        headers[REPLY_HEADER] = x.id
        resp = web.StreamResponse(status=x.status, headers=headers)
        async with self._sending(request):
            await resp.prepare(request)
            body, sent = x.body if body is None else body, 0
            for end, at in pieces:
                wait = at - (time.perf_counter() - started)
                if wait > 0:
                    await asyncio.sleep(wait)
                if end > sent:
                    await resp.write(body[sent:end])
                    sent = end
            if body[sent:]:
                await resp.write(body[sent:])
        if x.cut:
            request.transport.close()  # the bytes written go out, then FIN: no end of body
            raise asyncio.CancelledError  # aiohttp drops a cancelled handler without writing more
        async with self._sending(request):
            await resp.write_eof()
        return resp

    async def _relay(
        self, request: web.BaseRequest, path: str, query: str, body: bytes, rest: aiohttp.StreamReader | None = None
    ) -> web.StreamResponse:
        """The request sent on (to the upstream, or with its tags as sent to the recording proxy,
        which records it into the played run), its answer streamed back as it comes. `rest`: the
        part of the body not read yet, sent on as it arrives."""
        self.stats.relayed += 1
        listed = connection_listed(request.headers.items())
        if self.recording:
            # The recording proxy reads the request as serve would have: the client's tags as sent
            # (the run the played one), its Host (named in serve's answers, kept in the record).
            drop = (NOT_FORWARDED_UP - {"host"}) | listed
            headers = [(k, v) for k, v in request.headers.items() if k.lower() not in drop and k.lower() != RUN_HEADER]
            headers.append((RUN_HEADER, self.options.run))
        else:
            headers = [
                (k, v)
                for k, v in request.headers.items()
                if k.lower() not in NOT_FORWARDED_UP | listed and not k.lower().startswith(TAG_HEADER_PREFIX)
            ]
        data: bytes | AsyncIterator[bytes] | None = body or None
        if rest is not None:
            data = _stream(body, rest)
            if request.content_length is not None:
                headers.append(("Content-Length", str(request.content_length)))
        target = URL(self.relay_base + path + (f"?{query}" if query else ""), encoded=True)
        try:
            upstream = await self.session.request(
                request.method, target, headers=headers, data=data, allow_redirects=False
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
            async with self._sending(request):
                await resp.prepare(request)
                try:
                    async for piece in upstream.content.iter_any():
                        await resp.write(piece)
                except (aiohttp.ClientError, TimeoutError):
                    request.transport.close()
                    raise asyncio.CancelledError from None
                await resp.write_eof()
            return resp
        finally:
            upstream.close()


def answered_id(x: RecordedExchange, asked: bytes) -> bytes | None:
    """An MCP exchange's recorded reply with the id of the request it now answers, when the two
    ids differ (None: the recorded body as it is)."""
    if x.mcp_server is None:
        return None
    recorded, here = jsonrpc.read_message(x.request_body), jsonrpc.read_message(asked)
    if recorded.kind != jsonrpc.REQUEST or here.kind != jsonrpc.REQUEST or recorded.id_key == here.id_key:
        return None
    return jsonrpc.with_id(x.body, recorded.id_key, here.doc["id"])


def schedule(x: RecordedExchange) -> tuple[float, list[tuple[int, float]]]:
    """When `--pace recorded` sends what: (seconds before the headers, [(body offset to send up to,
    seconds since the start), ...]). As recorded (records hold finite numbers: JSON has no
    others), but no wait longer than serve's own timeouts would have let one be (TTFB_TIMEOUT for
    the first byte, IDLE_TIMEOUT between pieces), and nothing after the exchange's recorded
    duration: a first byte recorded at 1e12 ms is sent as soon as those allow, not never."""
    limit = TTFB_TIMEOUT + IDLE_TIMEOUT * len(x.pieces)
    end = min(_seconds(x.duration_ms), limit) if x.duration_ms is not None else limit
    first = min(_seconds(x.ttfb_ms), TTFB_TIMEOUT, end)
    out, at, then = [], first, _seconds(x.ttfb_ms)
    for offset, ms in x.pieces:
        now = _seconds(ms)
        at = min(at + min(max(now - then, 0.0), IDLE_TIMEOUT), end)
        then = max(then, now)
        out.append((min(offset, len(x.body)), at))
    return first, out


def _seconds(ms: float | None) -> float:
    """A recorded time in seconds; 0 for none, or for a negative one."""
    return max(ms or 0.0, 0.0) / 1000.0


async def _stream(read: bytes, rest: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    if read:
        yield read
    while True:
        async with asyncio.timeout(CLIENT_BODY_TIMEOUT):
            piece = await rest.readany()
        if not piece:
            return
        yield piece


def _error(
    status: int,
    message: str,
    code: str,
    miss: bool = False,
    path: str = "",
    family: str | None = None,
    close: bool = False,
) -> web.Response:
    """Playback's own answer, in the error shape the protocol's clients read (as serve's are);
    `close`: the connection closes after it (a body was left unread)."""
    headers = {REPLY_HEADER: "miss"} if miss else None
    resp = web.Response(
        status=status,
        body=protocol_error_body(family or wire.family_of(path), message, code, status),
        content_type="application/json",
        headers=headers,
    )
    if close:
        resp.force_close()
    return resp


@dataclass
class RunningPlayback:
    playback: Playback
    runner: web.ServerRunner | None = None
    recording: object | None = None  # the in-process proxy of --on-miss record
    port: int = 0  # where it listens, once it does
    url: str = ""

    @property
    def stats(self) -> PlaybackStats:
        return self.playback.stats

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.playback.session is not None:
            await self.playback.session.close()
        if self.recording is not None:
            await self.recording.stop()  # flushes the recorded misses


class CannotPlay(Exception):
    """The server could not start (address taken, the recording proxy failed); the message says why."""


def _upstream(options: PlaybackOptions) -> str:
    """--upstream as serve takes it (an http(s) URL with a host, no query, no /v1), normalised."""
    try:
        return ProxyConfig(upstream=options.upstream, data_dir=options.data_dir).upstream
    except ConfigError as exc:
        raise CannotPlay(str(exc)) from None


async def start_playback(fixture: Fixture, rules: MatchRules, options: PlaybackOptions) -> RunningPlayback:
    """The playback server listening on this loop (and, for --on-miss record, its recording proxy)."""
    playback = Playback(fixture, rules, options)
    running = RunningPlayback(playback)
    if options.on_miss == "record":
        if _CONTROL.search(options.run) or options.run != options.run.strip():
            raise CannotPlay(
                f"--on-miss record cannot record into run {printable(options.run)!r}: the run name goes "
                "in a header, which cannot carry control characters or surrounding spaces"
            )
        from toolproxy.proxy.server import start_proxy

        config = ProxyConfig(
            upstream=_upstream(options),
            data_dir=options.data_dir,
            port=0,
            quiet=True,
            live_page=False,
            allowed_hosts=options.allowed_hosts,
        )
        try:
            running.recording = await start_proxy(config)
        except CannotListen as exc:
            raise CannotPlay(f"the recording proxy for --on-miss record could not start: {exc}") from None
        playback.relay_base = running.recording.url
        redactor = running.recording.state.redactor
    else:
        if options.on_miss == "forward":
            playback.relay_base = _upstream(options)
        redactor = load_redactor(options.data_dir)
    if playback.relay_base is not None:
        # As serve's: a connection within 10 s, and no wait for a byte longer than its --ttfb-timeout.
        playback.session = aiohttp.ClientSession(
            auto_decompress=False,
            skip_auto_headers=_CLIENT_DEFAULTS,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=TTFB_TIMEOUT),
        )
    try:
        running.runner = await listen(
            playback.handle,
            options.host,
            options.port,
            header_timeout=CLIENT_HEADER_TIMEOUT,
            redactor=redactor,
            on_rejected=playback.rejected,
        )
    except CannotListen as exc:
        await running.stop()
        raise CannotPlay(str(exc)) from None
    running.port = running.runner.addresses[0][1]
    host = f"[{options.host}]" if ":" in options.host else options.host
    running.url = f"http://{host}:{running.port}"
    return running
