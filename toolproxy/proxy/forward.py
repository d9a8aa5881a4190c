"""The hot path: one request in, forwarded to the one configured upstream, streamed back.

The handler drives a `Flow` through its phases and calls the addons' hooks at each (see
`toolproxy.proxy.flow`); what is recorded, counted, refused or rewritten is decided there. Under
`native` nothing here parses JSON or touches the disk: bytes pass through and are tee'd.
Every way an exchange can end (answered, refused, unreachable, timed out, cut short by either
side, too large) ends the flow exactly once, so exactly one record is submitted.
"""

from __future__ import annotations

import asyncio
import errno
import time

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from toolproxy import wire
from toolproxy.proxy import admin, websocket
from toolproxy.proxy.admin import ADMIN_PREFIX
from toolproxy.proxy.admission import writer_backpressure
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.durability import late_hold
from toolproxy.proxy.errorbody import protocol_error_body
from toolproxy.proxy.flow import Cut, Flow, Refusal
from toolproxy.proxy.headers import Redactor
from toolproxy.proxy.modelswap import TAG as MODEL_TAG
from toolproxy.proxy.pool import CONNECTION
from toolproxy.proxy.spool import Spool, file_payload
from toolproxy.proxy.state import ProxyState
from toolproxy.proxy.tags import TAG_HEADER_PREFIX, header_tags, misplaced_refusal, place_path_tags
from toolproxy.record.model import encode_body
from toolproxy.record.spill import SpilledBody
from toolproxy.term.connection_errors import explain
from toolproxy.wire.hopbyhop import NOT_FORWARDED_DOWN, NOT_FORWARDED_UP, connection_listed

_CLIENT_GONE = (ConnectionResetError, ConnectionError, aiohttp.ClientConnectionResetError)
_UNWRITTEN = "Can not write request body"  # aiohttp's words when the connection was closed under the write


async def serve_request(state: ProxyState, request: web.BaseRequest) -> web.StreamResponse:
    raw_path = request.raw_path
    if raw_path.startswith(ADMIN_PREFIX):
        return await admin.answer(state, request)

    cfg = state.config
    flow = Flow(request, cfg.upstream, cfg.total_timeout, cfg.durability == "sync", state.record_type)
    state.watchdog.active.add(flow)
    try:
        return await _handle(state, flow, raw_path)
    except Refusal as r:
        return await _reply_error(state, flow, r.status, r.kind, r.message, r.code, r.family)
    except asyncio.CancelledError:
        if flow.expired is not None and flow.task.uncancel() == 0:
            return await _timed_out(state, flow)
        # The client went away (aiohttp cancels the handler): stop the upstream, keep what we have.
        flow.client_gone("client disconnected before the response was complete")
        state.hooks.end(flow)
        raise
    except Exception as exc:  # a bug in the proxy must still leave a record and a clear answer
        if flow.client_resp is not None and flow.client_resp.prepared:
            flow.rec.set_error("proxy_error", f"{type(exc).__name__}: {exc}")
            state.hooks.end(flow)
            raise
        return await _reply_error(
            state, flow, 500, "proxy_error", f"toolproxy internal error: {type(exc).__name__}: {exc}", "proxy_error"
        )
    finally:
        state.watchdog.active.discard(flow)


async def _reply_error(
    state: ProxyState, flow: Flow, status: int, kind: str, message: str, code: str, family: str | None = None
) -> web.Response:
    """The proxy's own answer when there is no upstream response to pass on."""
    rec = flow.rec
    rec.set_error(kind, message)
    body = protocol_error_body(family or wire.family_of(rec.path), message, code, status)
    rec.client_status = status
    rec.client_body, rec.client_body_encoding = encode_body(body)
    state.hooks.end(flow)
    # In sync durability the proxy's own answers (502, 504, 413...) wait for their record too.
    if flow.on_disk is not None:
        await flow.on_disk
    return web.Response(status=status, body=body, content_type="application/json")


async def _timed_out(state: ProxyState, flow: Flow) -> web.StreamResponse:
    """The watchdog cancelled this exchange: a 408/504 if nothing was sent yet, else a cut stream."""
    cfg, phase = state.config, flow.expired
    flow.rec.extra["timeout_phase"] = phase
    if phase == "client_body":
        return await _reply_error(
            state,
            flow,
            408,
            "client_timeout",
            f"the client sent its request body too slowly: nothing for {cfg.client_body_timeout:g}s "
            "(--client-body-timeout)",
            "request_timeout",
        )
    if phase == "first_byte" and flow.pool_queued_at is not None:
        message = (
            f"no connection to upstream {cfg.upstream} came free within {cfg.ttfb_timeout:g}s (--ttfb-timeout): "
            f"all {cfg.upstream_connections} of --upstream-connections were busy"
        )
    elif phase == "first_byte":
        message = f"upstream {cfg.upstream} sent no response within {cfg.ttfb_timeout:g}s (--ttfb-timeout)"
    elif phase == "idle":
        message = f"upstream {cfg.upstream} stalled mid-response: nothing for {cfg.idle_timeout:g}s (--idle-timeout)"
    else:
        message = f"exchange with upstream {cfg.upstream} exceeded --total-timeout {cfg.total_timeout:g}s"
    if flow.client_resp is None or not flow.client_resp.prepared:
        flow.client_resp = None
        return await _reply_error(state, flow, 504, "timeout", message, "upstream_timeout")
    flow.rec.set_error("timeout", message)
    return await _cut(state, flow, flow.client_resp)


async def _handle(state: ProxyState, flow: Flow, raw_path: str) -> web.StreamResponse:
    cfg, hooks = state.config, state.hooks
    label(flow, raw_path, state.redactor, cfg)
    for hook in hooks.request_headers:
        hook(flow)
    if "misplaced_tags" in flow.rec.extra:
        _misplaced_tags(flow)
    if state.writer.behind:  # checked here: a writer that keeps up costs no await
        await writer_backpressure(flow, state.writer)
    await _read_body(state, flow)
    for hook in hooks.request:
        hook(flow)

    url = _upstream_url(cfg.upstream + flow.up_path + ("?" + flow.up_query if flow.up_query else ""))
    if "Upgrade" in flow.request.headers and websocket.upgrade_asked(flow.request):
        websocket.offer(state, flow)
    return await _forward(state, flow, url)


def label(flow: Flow, raw_path: str, redactor: Redactor, cfg: ProxyConfig) -> None:
    """The record's labels (run, episode, item, condition, free tags) from the path's `/t/...`
    prefix and the X-Toolproxy-* headers, and what goes upstream without them: the path with
    the prefix taken off, the headers less tags and hop-by-hop ones, the query as sent (the
    record keeps it with its secrets redacted). Header tags win over path tags."""
    request, rec = flow.request, flow.rec
    rec.method = request.method
    path, _, query = raw_path.partition("?")
    safe_query = redactor.query(query)
    rec.client_path = path + ("?" + safe_query if query else "")
    headers = request.headers

    tags, path, misplaced = place_path_tags(path)
    flow.up_headers, tagged = _upstream_headers(headers)
    if tagged:
        tags.update(header_tags(headers.items()))
    rec.run = tags.pop("run", None) or cfg.default_run(rec.started_at)
    rec.episode = tags.pop("episode", None)
    rec.item = tags.pop("item", None)
    rec.condition = tags.pop("condition", None) or cfg.condition
    rec.tags = tags
    rec.path = flow.up_path = path
    rec.query = safe_query
    flow.up_query = query
    if misplaced is not None:
        rec.extra["misplaced_tags"] = misplaced  # refused once auth and exposure have seen the request


def _misplaced_tags(flow: Flow) -> None:
    rec = flow.rec
    raise misplaced_refusal(flow.request.host, rec.extra["misplaced_tags"], rec.client_path, wire.family_of(rec.path))


async def _read_body(state: ProxyState, flow: Flow) -> None:
    """The request body, read with a deadline per pause (the watchdog answers 408) and a size cap."""
    request, rec, cfg = flow.request, flow.rec, state.config
    loop = asyncio.get_running_loop()
    if request.content_length is not None and request.content_length > cfg.max_body:
        _too_large(flow, cfg.max_body, request.content_length)
    flow.phase = "client_body"
    content = request.content
    spool = Spool(cfg.spill_above, state.spill_dir)
    try:
        while True:
            flow.deadline = loop.time() + cfg.client_body_timeout
            chunk = await content.readany()
            if not chunk:
                break
            if spool.size + len(chunk) > cfg.max_body:
                _too_large(flow, cfg.max_body, request.content_length)
            backlog = spool.add(chunk)
            if backlog is not None:
                await backlog
        body = spool.finish()
        if isinstance(body, SpilledBody):
            await asyncio.wrap_future(body.ready)
    except _CLIENT_GONE as exc:
        flow.client_gone(f"client disconnected while sending the request: {exc}")
        state.hooks.end(flow)
        raise web.HTTPBadRequest() from exc
    flow.deadline = None
    flow.phase = "first_byte"
    flow.body = body
    if isinstance(body, SpilledBody):
        rec.request_body = body  # the writer thread reads it and sets the encoding
        if rec.condition != "native" or MODEL_TAG in rec.tags:  # a rewrite needs all of the body
            flow.body = await loop.run_in_executor(None, body.read)
    else:
        rec.request_body, rec.request_body_encoding = encode_body(body)
    rec.request_body_size = spool.size


def _too_large(flow: Flow, limit: int, declared: int | None) -> None:
    flow.rec.request_body_size = declared
    flow.refuse(
        413,
        "body_too_large",
        f"request body is larger than toolproxy's limit of {limit} bytes; raise it with --max-body",
        "request_too_large",
    )


_urls: dict[str, URL] = {}


def _upstream_url(target: str) -> URL:
    """The upstream URL object, built once per distinct target (agents use one or two paths)."""
    url = _urls.get(target)
    if url is None:
        url = URL(target, encoded=True)
        if len(_urls) < 1024:
            _urls[target] = url
    return url


def _upstream_headers(headers) -> tuple[dict[str, str], bool]:
    """The headers to forward, and whether tag headers were among them (one pass for both)."""
    drop = NOT_FORWARDED_UP
    if "Connection" in headers:
        drop = drop | connection_listed(headers.items())
    out = {}
    tagged = False
    for k, v in headers.items():
        lk = k.lower()
        if lk.startswith(TAG_HEADER_PREFIX):
            tagged = True
            continue
        if lk in drop:
            continue
        if k in out:
            out[k] = out[k] + ", " + v
        else:
            out[k] = v
    return out, tagged


async def _forward(state: ProxyState, flow: Flow, url: URL) -> web.StreamResponse:
    cfg = state.config
    upstream_name = cfg.upstream
    flow.deadline = asyncio.get_running_loop().time() + cfg.ttfb_timeout
    try:
        resp = await _send(state, flow, url)
    except aiohttp.ServerTimeoutError as exc:
        flow.rec.extra["timeout_phase"] = "connect"
        flow.refuse(504, "timeout", f"connecting to upstream {upstream_name} timed out: {exc}", "upstream_timeout")
    except aiohttp.ClientConnectorError as exc:
        flow.refuse(
            502,
            "connect",
            f"cannot connect to upstream {upstream_name}: {explain(exc).sentence()}",
            "upstream_unreachable",
        )
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as exc:
        flow.refuse(
            502,
            "upstream_closed",
            f"upstream {upstream_name} closed the connection before responding: {exc}",
            "upstream_closed",
        )
    except aiohttp.ClientError as exc:
        flow.refuse(
            502, "upstream_error", f"upstream {upstream_name} failed: {type(exc).__name__}: {exc}", "upstream_error"
        )

    if "Upgrade" in flow.up_headers:
        if resp.status == 101:
            try:
                return await websocket.tunnel(state, flow, resp)
            finally:
                resp.close()
        websocket.refused(flow)
    try:
        return await _relay(state, flow, resp)
    finally:
        if flow.rec.response_complete:
            resp.release()
        else:
            resp.close()  # stop the upstream generating for a client that is gone


async def _send(state: ProxyState, flow: Flow, url: URL) -> aiohttp.ClientResponse:
    """The upstream's response; a request the upstream cannot have read is sent once more.

    A proxy must not resend a request that may have been acted on (RFC 9110 9.2.2; aiohttp never
    resends a written POST, Go and nginx only when told it is idempotent). Two failures qualify:

    - the body could not be written at all: the connection was closed before the request left;
    - a kept-alive connection, handed over moments ago, was closed by the upstream before one
      byte of a response. Servers close kept-alive connections *between* requests: after an idle
      time (cpp-httplib, uvicorn, Node: 5 s; the pool lets go at 4), after N requests, and
      llama.cpp after every streamed response while announcing `Keep-Alive`. With a capped pool,
      aiohttp hands such a connection to a queued request in the instant before the close
      arrives; the server's connection loop has ended and never reads that request.

    What this cannot tell apart: a server that read the request and died (or aborted) within
    _CLOSE_RACE_S without a byte. That one gets the request once more, as its client's SDK would
    after a 502 (openai and anthropic retry connection errors by default). A close after
    _CLOSE_RACE_S (a gateway's read timeout during a long generation: the upstream worked) and a
    close of a fresh connection are never resent. Either way the record says so in
    `extra.resent`: one exchange, one record, the resend visible.
    """
    CONNECTION.set(None)
    try:
        return await _request(state, flow, url)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        reason = _unread(exc)
        if reason is None:
            raise
        flow.rec.extra["resent"] = f"{reason}: {exc}"
        state.counters.resent += 1
    return await _request(state, flow, url)


_CLOSE_RACE_S = 1.0  # a close racing a handover arrives within a round trip plus scheduling
_RESET = (errno.ECONNRESET, errno.EPIPE)


def _unread(exc: aiohttp.ClientError) -> str | None:
    """Why the upstream cannot have read the request that failed with `exc`, or None."""
    if _UNWRITTEN in str(exc):
        return "not written"
    connection = CONNECTION.get()
    if isinstance(exc, aiohttp.ClientConnectorError) or connection is None:
        return None  # no connection was made: nothing to race
    reused, handed_over = connection
    if not reused or time.monotonic() - handed_over > _CLOSE_RACE_S:
        return None
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        if not isinstance(exc.message, str):
            return None  # part of a response head came: the upstream read the request
    elif exc.errno not in _RESET:
        return None
    return "the upstream closed a kept-alive connection before answering"


def _request(state: ProxyState, flow: Flow, url: URL):
    body = flow.body
    if isinstance(body, SpilledBody):
        flow.up_headers["Content-Length"] = str(len(body))
        body = file_payload(body)  # a fresh reader each time: a resent body starts again
    return state.session.request(
        flow.request.method,
        url,
        data=body or None,
        headers=flow.up_headers,
        allow_redirects=False,
        trace_request_ctx=flow,
    )


async def _relay(state: ProxyState, flow: Flow, resp: aiohttp.ClientResponse) -> web.StreamResponse:
    request, rec, cfg, hooks = flow.request, flow.rec, state.config, state.hooks
    # The upstream's own time to first byte: a wait for a pooled connection is the proxy's, not its.
    rec.ttfb_ms = flow.elapsed_ms() - (flow.pool_wait or 0.0)
    rec.status = resp.status
    raw_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.raw_headers]
    flow.upstream_headers = raw_headers  # redacted for the record by the recorder, after the response
    drop = NOT_FORWARDED_DOWN | connection_listed(raw_headers)
    flow.out_headers = [(k, v) for k, v in raw_headers if k.lower() not in drop]
    flow.out_status, flow.out_reason = resp.status, resp.reason
    for hook in hooks.response_headers:
        hook(flow, resp)

    client = web.StreamResponse(status=flow.out_status, reason=flow.out_reason, headers=CIMultiDict(flow.out_headers))
    flow.client_resp = client
    rec.client_status = client.status

    chunk_hooks, stream, hold, spool, writer = hooks.response_chunk, flow.stream, flow.hold, flow.spool, state.writer
    loop = asyncio.get_running_loop()
    idle = cfg.idle_timeout
    content = resp.content
    flow.phase = "idle"
    try:
        # Body bytes that arrived with the headers leave with them, in one write. Only when they
        # are sure to be written at once: headers never wait for a body still to come.
        chunk = content.read_nowait(-1) if stream is None and hold is None else b""
        if chunk:
            client._send_headers_immediately = False  # aiohttp's own switch (web.Response uses it)
        if hold is None or not hold.headers_only:
            await client.prepare(request)
        while True:
            if not chunk:
                # Only the wait for the upstream is timed: a slow client is not an upstream stall.
                flow.deadline = loop.time() + idle
                chunk = await content.readany()
                flow.deadline = None
                if not chunk:
                    break
            for hook in chunk_hooks:
                backlog = hook(flow, chunk)
                if backlog is not None:
                    await backlog
            if hold is None and (writer.behind or writer.writing_large or spool.spilled is not None):
                # Its record may now miss the crash bound: this response's end waits for it too.
                hold = late_hold(flow, spool.size - len(chunk))
            if stream is not None:
                chunk = stream(chunk)
            if hold is not None:
                chunk = hold.take(chunk)
            if chunk:
                await client.write(chunk)
            chunk = b""
        rec.response_complete = True
        if stream is not None:
            tail = stream(b"")
            if hold is not None:
                tail = hold.take(tail)
            if tail:
                await client.write(tail)
    except aiohttp.ClientPayloadError as exc:
        rec.set_error("upstream_closed", f"upstream {cfg.upstream} closed the connection mid-response: {exc}")
        return await _cut(state, flow, client)
    except Cut as exc:
        rec.set_error(exc.kind, exc.message)
        return await _cut(state, flow, client)
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        rec.set_error("upstream_closed", f"upstream {cfg.upstream} connection failed mid-response: {exc}")
        return await _cut(state, flow, client)
    except _CLIENT_GONE as exc:
        flow.client_gone(f"client disconnected mid-response: {exc}")
        hooks.end(flow)
        return client

    if not flow.durable and (writer.behind or writer.writing_large):
        flow.durable = True  # since the last chunk: a chunked response's end can still wait
    if not flow.durable:
        # Nothing waits for the record: the client gets its last byte first, then it is made.
        try:
            await client.write_eof()
        except _CLIENT_GONE:
            pass  # the response was complete; the client left before its end reached it
        hooks.end(flow)
        return client
    hooks.end(flow)
    try:
        if flow.on_disk is not None:
            recorded = await flow.on_disk
            if not recorded and cfg.on_record_failure == "block":
                # The client must not take an unrecorded response for a complete one.
                request.transport.close()
                return client
            if not client.prepared:
                await client.prepare(request)
            if hold is not None and hold.held:
                await client.write(hold.held)
        await client.write_eof()
    except _CLIENT_GONE:
        pass  # the record is submitted; the client left before the response's end reached it
    return client


async def _cut(state: ProxyState, flow: Flow, client: web.StreamResponse) -> web.StreamResponse:
    """Pass a truncation on: the client gets the bytes so far and then a closed connection."""
    if flow.hold is not None and flow.hold.held and client.prepared:
        try:
            await client.write(flow.hold.held)
        except _CLIENT_GONE:
            pass
    state.hooks.end(flow)
    transport = flow.request.transport
    if transport is not None:
        transport.close()
    return client
