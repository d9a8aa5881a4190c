"""The hot path: one request in, forwarded to the one configured upstream, streamed back, recorded.

Under `native` nothing here parses JSON: bytes are tee'd into the record as they pass. Every
way an exchange can end (answered, refused, unreachable, timed out, cut short by either side,
too large) goes through `Exchange.finish`, which submits exactly one record.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from typing import TYPE_CHECKING

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from toolproxy.conditions import Plan, Reject, RequestView, Skip, load
from toolproxy.proxy import livepage
from toolproxy.proxy.headers import (
    NOT_FORWARDED_DOWN,
    NOT_FORWARDED_UP,
    TAG_HEADER_PREFIX,
    connection_listed,
    record_headers,
    redact_headers,
    redact_query,
)
from toolproxy.proxy.tags import header_tags, split_path_tags
from toolproxy.record.model import Record, encode_body, new_id

if TYPE_CHECKING:
    from toolproxy.proxy.app import ProxyState

ADMIN_PREFIX = "/_toolproxy/"
STATE: web.AppKey["ProxyState"] = web.AppKey("toolproxy_state")
_CLIENT_GONE = (ConnectionResetError, ConnectionError, aiohttp.ClientConnectionResetError)


def error_body(message: str, code: str, kind: str = "toolproxy_error") -> bytes:
    """OpenAI-style error JSON, so harnesses surface the cause instead of a parse failure."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


class Exchange:
    """Per-request state: the flow object everything on the hot path hangs on."""

    __slots__ = (
        "state", "request", "rec", "t0", "chunks", "client_chunks", "client_resp", "done",
        "task", "deadline", "hard_deadline", "phase", "expired", "held",
    )

    def __init__(self, state: "ProxyState", request: web.Request) -> None:
        self.state = state
        self.request = request
        self.t0 = time.perf_counter()
        self.rec = Record(id=new_id(), started_at=time.time(), upstream=state.config.upstream)
        self.chunks: list[bytes] = []
        self.client_chunks: list[bytes] | None = None
        self.client_resp: web.StreamResponse | None = None
        self.done = False
        # Read by the Watchdog: the current phase's deadline, the --total-timeout one, and why it fired.
        self.task = asyncio.current_task()
        total = state.config.total_timeout
        self.deadline: float | None = None
        self.hard_deadline = None if total is None else asyncio.get_running_loop().time() + total
        self.phase = "first_byte"
        self.expired: str | None = None
        self.held: bytes | None = None  # in sync durability the last bytes wait for the record's fsync

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0

    async def reply_error(self, status: int, kind: str, message: str, code: str) -> web.Response:
        """The proxy's own answer when there is no upstream response to pass on."""
        self.rec.set_error(kind, message)
        body = error_body(message, code)
        self.rec.client_status = status
        self.rec.client_body, self.rec.client_body_encoding = encode_body(body)
        # In sync durability the proxy's own answers (502, 504, 413...) wait for their record too.
        await self.finish(wait=self.state.config.durability == "sync")
        return web.Response(status=status, body=body, content_type="application/json")

    def finalize(self) -> Record:
        rec = self.rec
        rec.ended_at = time.time()
        rec.duration_ms = self.elapsed_ms()
        if self.chunks:
            rec.response_body, rec.response_body_encoding = encode_body(b"".join(self.chunks))
        elif rec.status is not None and rec.response_body is None:
            rec.response_body, rec.response_body_encoding = "", "utf8"
        if self.client_chunks is not None:
            rec.client_body, rec.client_body_encoding = encode_body(b"".join(self.client_chunks))
        if rec.client_status is None and self.client_resp is not None:
            rec.client_status = self.client_resp.status
        return rec

    async def finish(self, wait: bool = False) -> bool:
        """Submit the one record for this exchange. With wait, return once it is on disk."""
        if self.done:
            return True
        self.done = True
        rec = self.finalize()
        self.state.count(rec)
        if wait:
            return await self.state.writer.submit_and_wait(rec)
        return self.state.writer.submit(rec)


async def handle(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    raw_path = request.raw_path
    if raw_path.startswith(ADMIN_PREFIX):
        token = state.config.auth_token
        if token is not None and not _presented_token(request.headers, token)[0] and not livepage.has_cookie(request, token):
            gate = await livepage.unauthorised(request, raw_path[len(ADMIN_PREFIX):].split("?")[0].strip("/"), token)
            if gate is not None:
                return gate
            # The counters name the upstream and the data directory: not for anonymous callers.
            return web.Response(status=401, body=error_body(
                "this toolproxy requires a token for its admin routes too: send 'X-Toolproxy-Token: <token>'",
                "toolproxy_unauthorized"), content_type="application/json")
        return await state.admin(request)

    ex = Exchange(state, request)
    state.in_flight += 1
    state.watchdog.active.add(ex)
    try:
        return await _handle(ex, raw_path)
    except asyncio.CancelledError:
        if ex.expired is not None and ex.task.uncancel() == 0:
            return await _timed_out(ex)
        # The client went away (aiohttp cancels the handler): stop the upstream, keep what we have.
        ex.rec.set_error("client_closed", "client disconnected before the response was complete")
        await ex.finish()
        raise
    except Exception as exc:  # a bug in the proxy must still leave a record and a clear answer
        if ex.client_resp is not None and ex.client_resp.prepared:
            ex.rec.set_error("proxy_error", f"{type(exc).__name__}: {exc}")
            await ex.finish()
            raise
        return await ex.reply_error(500, "proxy_error", f"toolproxy internal error: {type(exc).__name__}: {exc}", "proxy_error")
    finally:
        state.in_flight -= 1
        state.watchdog.active.discard(ex)


async def _timed_out(ex: Exchange) -> web.StreamResponse:
    """The watchdog cancelled this exchange: a 504 if nothing was sent yet, else a cut stream."""
    cfg, phase = ex.state.config, ex.expired
    ex.rec.extra["timeout_phase"] = phase
    if phase == "first_byte":
        message = f"upstream {cfg.upstream} sent no response within {cfg.ttfb_timeout:g}s (--ttfb-timeout)"
    elif phase == "idle":
        message = f"upstream {cfg.upstream} stalled mid-response: nothing for {cfg.idle_timeout:g}s (--idle-timeout)"
    else:
        message = f"exchange with upstream {cfg.upstream} exceeded --total-timeout {cfg.total_timeout:g}s"
    if ex.client_resp is None or not ex.client_resp.prepared:
        ex.client_resp = None
        return await ex.reply_error(504, "timeout", message, "upstream_timeout")
    ex.rec.set_error("timeout", message)
    return await _cut(ex, ex.client_resp)


async def _handle(ex: Exchange, raw_path: str) -> web.StreamResponse:
    state, request, rec, cfg = ex.state, ex.request, ex.rec, ex.state.config
    rec.method = request.method
    path, _, query = raw_path.partition("?")
    safe_query = redact_query(query)
    rec.client_path = path + ("?" + safe_query if query else "")
    headers = request.headers
    rec.request_headers = record_headers(request.raw_headers)

    if not path.startswith("/"):
        return await ex.reply_error(
            400, "proxy_error",
            "absolute-form request targets are refused: toolproxy forwards only to its configured upstream "
            f"({cfg.upstream}); send requests to its own address instead",
            "not_a_forward_proxy",
        )

    tags, path = split_path_tags(path)
    if any(k.lower().startswith(TAG_HEADER_PREFIX) for k in headers):
        tags.update(header_tags(headers.items()))
    rec.run = tags.pop("run", None) or cfg.run
    rec.episode = tags.pop("episode", None)
    rec.item = tags.pop("item", None)
    rec.condition = tags.pop("condition", None) or cfg.condition
    rec.tags = tags
    rec.path = path
    rec.query = safe_query

    forward_auth = True
    if cfg.auth_token is not None:
        presented, forward_auth = _presented_token(headers, cfg.auth_token)
        if not presented:
            return await ex.reply_error(
                401, "unauthorized",
                "this toolproxy requires a token: send it as 'X-Toolproxy-Token: <token>' or as the API key",
                "toolproxy_unauthorized",
            )

    if cfg.on_record_failure == "block" and state.writer.stats.degraded:
        return await ex.reply_error(
            503, "recording_failed",
            f"toolproxy cannot record right now ({state.writer.stats.last_error}) and was started with "
            "--on-record-failure block, so it refuses to serve unrecorded traffic",
            "recording_unavailable",
        )
    if state.writer.behind:  # backpressure: new work waits while the writer catches up
        waited = time.perf_counter()
        await state.writer.caught_up()
        rec.extra["recording_wait_ms"] = round((time.perf_counter() - waited) * 1000.0, 3)

    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        rec.request_body_size = request.content_length
        return await ex.reply_error(
            413, "body_too_large",
            f"request body is larger than toolproxy's limit of {cfg.max_body} bytes; raise it with --max-body",
            "request_too_large",
        )
    except _CLIENT_GONE as exc:
        rec.set_error("client_closed", f"client disconnected while sending the request: {exc}")
        await ex.finish()
        raise web.HTTPBadRequest() from exc
    rec.request_body, rec.request_body_encoding = encode_body(body)
    rec.request_body_size = len(body)

    up_headers = _upstream_headers(headers, forward_auth, cfg.upstream_key)
    plan = _plan(ex, path, query, up_headers, body)
    if isinstance(plan, Reject):
        rec.condition_note = f"rejected: {plan.message}"
        return await ex.reply_error(plan.status, "condition_rejected", plan.message, "condition_rejected")
    if plan is not None:
        up_path, body = plan.path, plan.body
        up_headers.update(plan.headers)
        up_headers["Accept-Encoding"] = "identity"  # the transform must read the body
        up_path, _, query = up_path.partition("?")
        rec.upstream_request = {"path": up_path, "query": query, "headers": redact_headers(plan.headers.items())}
        rec.upstream_request["body"], rec.upstream_request["body_encoding"] = encode_body(body)
    else:
        up_path = path

    url = URL(cfg.upstream + up_path + ("?" + query if query else ""), encoded=True)
    return await _forward(ex, url, up_headers, body, plan)


def _connect_cause(exc: aiohttp.ClientConnectorError) -> str:
    """The OS's words for why ("Connection refused"), not asyncio's "[Errno 111] Connect call failed"."""
    err = exc.os_error
    if err.errno and err.errno > 0:
        return os.strerror(err.errno)
    return err.strerror or str(err) or type(err).__name__


def _presented_token(headers, token: str) -> tuple[bool, bool]:
    """(authorised, forward the Authorization header upstream)."""
    # Compared as bytes: a value with a byte that is not UTF-8 (a surrogate escape here) is a
    # wrong token (401), not an encoding error (500).
    given = headers.get("X-Toolproxy-Token")
    if given is not None:
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()), True
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return hmac.compare_digest(auth[7:].strip().encode("utf-8", "surrogateescape"), token.encode()), False
    return False, True


def _upstream_headers(headers, forward_auth: bool, upstream_key: str | None) -> dict[str, str]:
    drop = NOT_FORWARDED_UP
    if "Connection" in headers:
        drop = drop | connection_listed(headers.items())
    out = {}
    for k, v in headers.items():
        lk = k.lower()
        if lk in drop or lk.startswith(TAG_HEADER_PREFIX) or (lk == "authorization" and not forward_auth):
            continue
        if k in out:
            out[k] = out[k] + ", " + v
        else:
            out[k] = v
    if upstream_key is not None:
        for k in [k for k in out if k.lower() == "authorization"]:
            del out[k]
        out["Authorization"] = f"Bearer {upstream_key}"
    return out


def _plan(ex: Exchange, path: str, query: str, headers, body: bytes) -> Plan | Reject | None:
    """The condition's rewrite, a refusal to forward, or None to forward untouched (recording why it skipped)."""
    rec = ex.rec
    if rec.condition == "native":
        return None
    try:
        condition = load(rec.condition)
    except (ValueError, ImportError) as exc:
        rec.condition_note = f"skipped: {exc}"
        return None
    outcome = condition.prepare(
        RequestView(ex.request.method, path, query, headers, body), ex.state.config.condition_options
    )
    if isinstance(outcome, Skip):
        rec.condition_note = f"skipped: {outcome.reason}"
        return None
    return outcome


async def _forward(ex: Exchange, url: URL, up_headers, body: bytes, plan: Plan | None) -> web.StreamResponse:
    state, request, rec, cfg = ex.state, ex.request, ex.rec, ex.state.config
    upstream_name = cfg.upstream
    ex.deadline = asyncio.get_running_loop().time() + cfg.ttfb_timeout
    try:
        resp = await state.session.request(
            request.method, url, data=body or None, headers=up_headers, allow_redirects=False,
        )
    except aiohttp.ServerTimeoutError as exc:
        rec.extra["timeout_phase"] = "connect"
        return await ex.reply_error(
            504, "timeout", f"connecting to upstream {upstream_name} timed out: {exc}", "upstream_timeout"
        )
    except aiohttp.ClientConnectorError as exc:
        return await ex.reply_error(
            502, "connect",
            f"cannot connect to upstream {upstream_name}: {_connect_cause(exc)}. Is the model server running?",
            "upstream_unreachable",
        )
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as exc:
        return await ex.reply_error(
            502, "upstream_closed",
            f"upstream {upstream_name} closed the connection before responding: {exc}",
            "upstream_closed",
        )
    except aiohttp.ClientError as exc:
        return await ex.reply_error(
            502, "upstream_error", f"upstream {upstream_name} failed: {type(exc).__name__}: {exc}", "upstream_error"
        )

    try:
        return await _relay(ex, resp, plan)
    finally:
        if rec.response_complete:
            resp.release()
        else:
            resp.close()  # stop the upstream generating for a client that is gone


async def _relay(ex: Exchange, resp: aiohttp.ClientResponse, plan: Plan | None) -> web.StreamResponse:
    request, rec, cfg = ex.request, ex.rec, ex.state.config
    rec.ttfb_ms = ex.elapsed_ms()
    rec.status = resp.status
    raw_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.raw_headers]
    rec.response_headers = redact_headers(raw_headers)

    transform = plan.transform if plan is not None else None
    if transform is None:
        drop = NOT_FORWARDED_DOWN | connection_listed(raw_headers)
        out_headers = [(k, v) for k, v in raw_headers if k.lower() not in drop]
        status = resp.status
    else:
        status, out_headers = transform.start(resp.status, resp.headers)
        ex.client_chunks = []
    client = web.StreamResponse(status=status, reason=resp.reason if transform is None else None)
    for k, v in out_headers:
        client.headers.add(k, v)
    ex.client_resp = client

    # While the writer is behind, a response is answered as in sync mode: its end waits for its
    # record, so a crash cannot take records of responses that finished long before it.
    sync = cfg.durability == "sync" or ex.state.writer.behind
    loop = asyncio.get_running_loop()
    idle = cfg.idle_timeout
    content = resp.content
    ex.phase = "idle"
    try:
        await client.prepare(request)
        while True:
            # Only the wait for the upstream is timed: a slow client is not an upstream stall.
            ex.deadline = loop.time() + idle
            chunk = await content.readany()
            ex.deadline = None
            if not chunk:
                break
            ex.chunks.append(chunk)
            if transform is not None:
                chunk = transform.feed(chunk)
                if not chunk:
                    continue
                ex.client_chunks.append(chunk)
            if sync:
                chunk, ex.held = ex.held, chunk
                if chunk is None:
                    continue
            await client.write(chunk)
    except aiohttp.ClientPayloadError as exc:
        rec.set_error("upstream_closed", f"upstream {cfg.upstream} closed the connection mid-response: {exc}")
        return await _cut(ex, client)
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        rec.set_error("upstream_closed", f"upstream {cfg.upstream} connection failed mid-response: {exc}")
        return await _cut(ex, client)
    except _CLIENT_GONE as exc:
        rec.set_error("client_closed", f"client disconnected mid-response: {exc}")
        await ex.finish()
        return client

    rec.response_complete = True
    try:
        if transform is not None:
            tail = transform.finish()
            rec.condition_note = getattr(transform, "note", None)
            if tail:
                ex.client_chunks.append(tail)
                if sync:
                    if ex.held is not None:
                        await client.write(ex.held)
                    ex.held = tail
                else:
                    await client.write(tail)
        if sync:
            recorded = await ex.finish(wait=True)
            if not recorded and cfg.on_record_failure == "block":
                # The client must not take an unrecorded response for a complete one.
                request.transport.close()
                return client
            if ex.held is not None:
                await client.write(ex.held)
        else:
            await ex.finish()
        await client.write_eof()
    except _CLIENT_GONE as exc:
        rec.set_error("client_closed", f"client disconnected at the end of the response: {exc}")
        await ex.finish()
    return client


async def _cut(ex: Exchange, client: web.StreamResponse) -> web.StreamResponse:
    """Pass a truncation on: the client gets the bytes so far and then a closed connection."""
    if ex.held is not None:
        try:
            await client.write(ex.held)
        except _CLIENT_GONE:
            pass
    await ex.finish()
    transport = ex.request.transport
    if transport is not None:
        transport.close()
    return client
