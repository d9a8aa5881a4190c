"""A WebSocket on a model route (OpenAI Responses' WebSocket mode, Codex's first choice), passed
through to the upstream and recorded an exchange per response.

The client's upgrade request goes upstream with its `Upgrade` and `Connection` headers (every
other rule of the HTTP path holds: tags, auth, admission, the one configured upstream). An
upstream that answers anything but 101 is relayed like any HTTP answer, its record marked
`extra.websocket.upgrade = "refused"`. On 101 the proxy becomes a tunnel: the bytes of both
directions pass through as they come (handshake, frames, masks and compression are the two ends'
business) while a copy of each is read into messages (toolproxy.wire.websocket).

What is recorded (docs/record.md): the connection is one record (`GET`, status 101, its
lifetime, how it closed, counts of the messages that belong to no exchange), and each
`response.create` the client sends opens an exchange of its own: its request body is that
message, its response body the server's messages until the one that ends the response
(`response.completed`, `response.incomplete`, `response.failed`, `error`), each followed by a
newline. Those records go through the same recorder, masking, limits (`--max-body` per client
message, `--max-response` per exchange) and durability as an HTTP exchange: under `--durability
sync`, or while the writer is behind, the message that ends a response reaches the client only
once its record is on disk.

Under a condition that rewrites requests (or a bridge of Responses) a WebSocket cannot be
rewritten, so the upgrade is not offered upstream: the request goes as a plain GET, as HTTP
says a server that does not upgrade answers it, and the client falls back to HTTP, where the
condition applies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from toolproxy import wire
from toolproxy.proxy.flow import Cut, Flow, Refusal
from toolproxy.proxy.state import ProxyState
from toolproxy.record.model import WEBSOCKET, encode_body
from toolproxy.wire.websocket import BINARY, CLOSE, TEXT, FrameMessage, FrameReader, close_code, negotiated_deflate

# Server events that end a response (OpenAI's WebSocket mode sends the same events as its stream).
ENDS_RESPONSE = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
CREATE = "response.create"
# Bytes queued toward one side before the other side's reading pauses.
_HIGH_WATER = 1 << 20


def upgrade_asked(request: web.BaseRequest) -> bool:
    """The request asks to become a WebSocket (RFC 6455 4.1)."""
    return request.headers.get("Upgrade", "").strip().lower() == "websocket"


def offer(state: ProxyState, flow: Flow) -> bool:
    """Ready an upgrade request to go upstream; False (with the reason recorded) when a rewrite
    applies to this request, which a tunnel would bypass: then it goes as a plain GET."""
    rec, options = flow.rec, state.config.condition_options
    if rec.condition != "native":
        why = f"the {rec.condition} condition rewrites HTTP requests only"
    elif wire.family_of(rec.path) in options.bridge:
        why = "--bridge translates HTTP requests only"
    else:
        flow.up_headers["Connection"] = "Upgrade"
        flow.up_headers["Upgrade"] = "websocket"
        rec.extra[WEBSOCKET] = {"upgrade": "asked"}
        return True
    rec.extra[WEBSOCKET] = {"upgrade": "not offered", "why": why}
    return False


def refused(flow: Flow) -> None:
    """The upstream answered the upgrade with something else: relayed as HTTP, marked so."""
    flow.rec.extra[WEBSOCKET] = {"upgrade": "refused"}


class _Side:
    """One direction's bytes as they arrive, queued for the coroutine that passes them on; the
    source's reading pauses while too much waits. aiohttp calls feed_data and feed_eof (it takes
    this object as the connection's payload parser)."""

    def __init__(self, source: asyncio.Transport | None) -> None:
        self.source = source
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.eof = False
        self.ready = asyncio.Event()
        self.paused = False

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if data:
            self.chunks.append(data)
            self.size += len(data)
            self.ready.set()
            if self.size > _HIGH_WATER and not self.paused and self.source is not None:
                self.paused = True
                self.source.pause_reading()
        return False, b""

    def feed_eof(self) -> None:
        self.eof = True
        self.ready.set()

    def set_exception(self, exc: BaseException, cause: BaseException | None = None) -> None:
        self.feed_eof()

    async def take(self) -> bytes | None:
        """The next chunk, or None once the source has ended."""
        while not self.chunks:
            if self.eof:
                return None
            self.ready.clear()
            await self.ready.wait()
        chunk = self.chunks.popleft()
        self.size -= len(chunk)
        if self.paused and self.size < _HIGH_WATER // 2 and self.source is not None:
            self.paused = False
            self.source.resume_reading()
        return chunk


async def _drained(transport: asyncio.BaseTransport) -> None:
    while not transport.is_closing() and transport.get_write_buffer_size() > _HIGH_WATER:
        await asyncio.sleep(0.005)


class _Tunnel:
    """One upgraded connection: its two pumps, and the exchange the messages so far belong to."""

    def __init__(self, state: ProxyState, flow: Flow, resp: aiohttp.ClientResponse) -> None:
        self.state, self.flow, self.resp = state, flow, resp
        cfg = state.config
        deflate = negotiated_deflate(resp.headers.get("Sec-WebSocket-Extensions"))
        self.client_frames = FrameReader(
            deflate=deflate is not None,
            no_context_takeover=bool(deflate and deflate.client_no_context_takeover),
            limit=cfg.max_body,
        )
        self.server_frames = FrameReader(
            deflate=deflate is not None,
            no_context_takeover=bool(deflate and deflate.server_no_context_takeover),
            limit=cfg.max_response,
        )
        self.exchange: Flow | None = None
        self.exchanges = 0
        self.other: Counter[str] = Counter()  # messages that belong to no exchange, by kind
        self.closed_by: dict = {}
        self.client_gone = False

    # -- the exchanges

    def _open(self, payload: bytes) -> None:
        if self.exchange is not None:
            self._end(self.exchange, "client_closed", "a new response.create came before this response ended")
        conn, state = self.flow.rec, self.state
        flow = Flow(self.flow.request, conn.upstream, None, state.config.durability == "sync")
        rec = flow.rec
        for name in ("run", "episode", "item", "condition", "tags", "method", "path", "query", "client_path"):
            setattr(rec, name, getattr(conn, name))
        rec.request_body, rec.request_body_encoding = encode_body(payload)
        rec.request_body_size = len(payload)
        rec.status = rec.client_status = conn.status
        rec.extra[WEBSOCKET] = {"connection": conn.id, "exchange": self.exchanges}
        flow.upstream_headers = self.flow.upstream_headers
        flow.up_path, flow.up_query, flow.up_headers = self.flow.up_path, self.flow.up_query, dict(self.flow.up_headers)
        flow.phase = "first_byte"
        try:
            for hook in state.hooks.request_headers:
                hook(flow)
        except Refusal as r:  # recording unavailable, the disk budget full: the connection ends
            rec.set_error(r.kind, r.message)
            state.hooks.end(flow)
            raise Cut(r.kind, r.message) from None
        for hook in state.hooks.response_headers:
            hook(flow, self.resp)
        self.exchanges += 1
        self.exchange = flow
        self.flow.deadline = asyncio.get_running_loop().time() + state.config.ttfb_timeout
        self.flow.phase = "first_byte"

    def _event(self, flow: Flow, payload: bytes) -> bool:
        """A server message of the open exchange; True when it ends the response."""
        rec = flow.rec
        if rec.ttfb_ms is None:
            rec.ttfb_ms = flow.elapsed_ms()
        if b"\n" in payload:
            rec.extra[WEBSOCKET]["newline_in_message"] = True
        for hook in self.state.hooks.response_chunk:
            hook(flow, payload + b"\n")  # the recorder's spool; a Cut past --max-response
        self.flow.deadline = asyncio.get_running_loop().time() + self.state.config.idle_timeout
        self.flow.phase = "idle"
        return _kind(payload) in ENDS_RESPONSE

    def _end(self, flow: Flow, kind: str | None = None, message: str = "") -> None:
        if kind is not None:
            flow.rec.set_error(kind, message)
        else:
            flow.rec.response_complete = True
        writer = self.state.writer
        if not flow.durable and (writer.behind or writer.writing_large):
            flow.durable = True  # its record may miss the crash bound: the response's end waits for it
        if self.exchange is flow:
            self.exchange = None
            self.flow.deadline = None
        self.state.hooks.end(flow)

    # -- the two directions

    def client_message(self, message: FrameMessage) -> None:
        if message.opcode == CLOSE:
            self.closed_by.setdefault("client", close_code(message.payload))
        if message.opcode not in (TEXT, BINARY):
            self.other[f"client {_OPCODES.get(message.opcode, message.opcode)}"] += 1
            return
        if message.payload is None:
            self._too_large("client", message.size, self.state.config.max_body, "body_too_large", "--max-body")
            return
        kind = _kind(message.payload) if message.opcode == TEXT else None
        if kind == CREATE:
            self._open(message.payload)
        else:
            self.other[f"client {kind or 'binary'}"] += 1

    def server_message(self, message: FrameMessage) -> bool:
        """True when the message ended the open exchange's response."""
        if message.opcode == CLOSE:
            self.closed_by.setdefault("server", close_code(message.payload))
        flow = self.exchange
        if message.opcode not in (TEXT, BINARY) or flow is None:
            kind = _kind(message.payload) if message.opcode == TEXT and message.payload else None
            self.other[f"server {kind or _OPCODES.get(message.opcode, message.opcode)}"] += 1
            return False
        if message.payload is None:
            self._too_large(
                "server", message.size, self.state.config.max_response, "response_too_large", "--max-response"
            )
            return False
        try:
            ends = self._event(flow, message.payload)
        except Cut as cut:
            self._end(flow, cut.kind, cut.message)
            raise
        if ends:
            self._end(flow)
        return ends

    def _too_large(self, side: str, size: int, limit: int, kind: str, option: str) -> None:
        text = f"a {side} message of {size} bytes is larger than toolproxy's limit of {limit} ({option})"
        if self.exchange is not None:
            self._end(self.exchange, kind, text)
        raise Cut(kind, text)

    async def upstream_to_client(self, side: _Side, client: asyncio.Transport, writer) -> None:
        while (chunk := await side.take()) is not None:
            durable: list[asyncio.Future] = []
            for message in self.server_frames.feed(chunk):
                flow = self.exchange
                if self.server_message(message) and flow is not None and flow.on_disk is not None:
                    durable.append(flow.on_disk)
            for on_disk in durable:  # the end of a response waits for its record (sync, or a writer behind)
                await on_disk
            if client.is_closing():
                self.client_gone = True
                return
            client.write(chunk)
            await writer.drain()

    async def client_to_upstream(self, side: _Side, upstream: asyncio.Transport) -> None:
        while (chunk := await side.take()) is not None:
            for message in self.client_frames.feed(chunk):
                self.client_message(message)
            if upstream.is_closing():
                return
            upstream.write(chunk)
            await _drained(upstream)
        self.client_gone = True


def _kind(payload: bytes | None) -> str | None:
    """A JSON message's `type`, or None."""
    try:
        obj = orjson.loads(payload) if payload else None
    except orjson.JSONDecodeError:
        return None
    kind = obj.get("type") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else None


_OPCODES = {CLOSE: "close", 0x9: "ping", 0xA: "pong", BINARY: "binary"}


async def tunnel(state: ProxyState, flow: Flow, resp: aiohttp.ClientResponse) -> web.StreamResponse:
    """Pass the upgraded connection through until either side ends it; the handler's own record
    (the connection's) is made when it ends."""
    request, rec, hooks = flow.request, flow.rec, state.hooks
    rec.ttfb_ms = flow.elapsed_ms() - (flow.pool_wait or 0.0)
    rec.status = rec.client_status = resp.status
    raw_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.raw_headers]
    flow.upstream_headers = raw_headers
    rec.extra[WEBSOCKET] = {"upgrade": "accepted"}
    headers = CIMultiDict((k, v) for k, v in raw_headers if k.lower() not in ("content-length", "transfer-encoding"))
    client = web.StreamResponse(status=101, reason=resp.reason, headers=headers)
    client.force_close()
    flow.client_resp = client
    flow.phase, flow.deadline = "idle", None
    writer = await client.prepare(request)
    connection = resp.connection
    if connection is None or connection.transport is None or request.transport is None:
        rec.set_error("upstream_closed", "the upstream closed the connection right after agreeing to upgrade")
        hooks.end(flow)
        return client
    up, down = _Side(request.transport), _Side(connection.transport)
    request.protocol.set_parser(up)
    connection.protocol.set_parser(down, down)
    request.protocol.keep_alive(False)
    t = _Tunnel(state, flow, resp)
    pumps = [
        asyncio.ensure_future(t.client_to_upstream(up, connection.transport)),
        asyncio.ensure_future(t.upstream_to_client(down, request.transport, writer)),
    ]
    problem: tuple[str, str] | None = None
    try:
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            exc = task.exception()
            if isinstance(exc, Cut):
                problem = (exc.kind, exc.message)
            elif exc is not None:
                problem = ("proxy_error", f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        problem = _cancelled(state, flow, t)
    finally:
        for task in pumps:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(*pumps, return_exceptions=True)
        connection.transport.close() if connection.transport is not None else None
        if request.transport is not None:
            request.transport.close()
        _finish(t, problem)
    return client


def _cancelled(state: ProxyState, flow: Flow, t: _Tunnel) -> tuple[str, str] | None:
    """Why the handler was cancelled: the watchdog (an upstream that stopped answering), the
    client's connection ending (aiohttp cancels the handler then: None, the tunnel simply ends),
    or the proxy stopping. The cancellation is taken here: the connection's record is still to
    be made."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    if flow.expired is not None:
        limit = state.config.ttfb_timeout if flow.expired == "first_byte" else state.config.idle_timeout
        return "timeout", f"upstream {state.config.upstream} sent nothing on the WebSocket for {limit:g}s"
    transport = flow.request.transport
    if "client" in t.closed_by or transport is None or transport.is_closing():
        t.client_gone = True
        return None
    return "proxy_error", "toolproxy stopped while the WebSocket was open"


def _finish(t: _Tunnel, problem: tuple[str, str] | None) -> None:
    """The open exchange ended by how the connection ended, then the connection's own record."""
    flow, state = t.flow, t.state
    if t.exchange is not None:
        if problem is not None:
            kind, message = problem
        elif t.client_gone:
            kind, message = "client_closed", "the client closed the WebSocket before the response ended"
        else:
            kind, message = "upstream_closed", "the upstream closed the WebSocket before the response ended"
        t._end(t.exchange, kind, message)
    info = flow.rec.extra[WEBSOCKET]
    info["exchanges"] = t.exchanges
    if t.other:
        info["other_messages"] = dict(t.other)
    for side, (code, reason) in t.closed_by.items():
        info[f"{side}_close"] = {"code": code, "reason": reason}
    for side, frames in (("client", t.client_frames), ("server", t.server_frames)):
        if frames.broken is not None:
            info[f"{side}_unread"] = frames.broken
    if problem is not None:
        flow.rec.set_error(*problem)
    else:
        flow.rec.response_complete = True
    state.hooks.end(flow)
