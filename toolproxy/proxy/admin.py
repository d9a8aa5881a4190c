"""Every route under /_toolproxy/, in one place: who may use them, and what each answers by
asking its owner. Never forwarded upstream, never recorded as exchanges.

    /_toolproxy/health, /stats, /    the stats (ProxyState.snapshot, merged across a group's
                                     workers; health answers 503 when recording is not ok); `/`
                                     is the live page for a browser (Accept: text/html)
    /_toolproxy/live                 the live page's JSON (toolproxy.live: LiveView.report)
    /_toolproxy/exchange/ID          one recent exchange (LiveView.detail)
    /_toolproxy/login                how a browser gets past --auth-token

With --auth-token every route wants the token, in the X-Toolproxy-Token header (or as the API
key), or the page's cookie. A browser cannot send the header, so the page offers a form: the token
is POSTed once (never in a URL that a history, a proxy log or a recording keeps) and answered with
an HttpOnly, SameSite=Strict cookie scoped to /_toolproxy/. The cookie holds an HMAC of the token,
not the token itself. Scripts that can only open a URL (a headless browser taking a screenshot)
may use /_toolproxy/login?token=...: it sets the same cookie and redirects to the clean address at
once. Anyone else is answered 401 (and counted: the stats name the upstream and the data directory).

The page (toolproxy/live/page.html: inline CSS and JS, nothing from the network) is sent with a
Content-Security-Policy that lets only its own nonce-tagged script and style run and lets it fetch
only from this origin. Everything a model or client wrote is put on the page through textContent,
never parsed as HTML.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from urllib.parse import parse_qs

import orjson
from aiohttp import web

from toolproxy.proxy.auth import presented_token
from toolproxy.proxy.errorbody import error_body
from toolproxy.proxy.refusals import ADMIN_UNAUTHORIZED
from toolproxy.proxy.state import ProxyState

ADMIN_PREFIX = "/_toolproxy/"
COOKIE = "toolproxy_page"


def cookie_value(token: str) -> str:
    return hmac.new(token.encode("utf-8", "surrogateescape"), b"toolproxy page session", hashlib.sha256).hexdigest()


def has_cookie(request: web.Request, token: str) -> bool:
    given = request.cookies.get(COOKIE)
    return given is not None and hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), cookie_value(token).encode()
    )


def wants_html(request: web.Request) -> bool:
    return "text/html" in request.headers.get("Accept", "")


def _secured(resp: web.Response, nonce: str | None = None) -> web.Response:
    src = f"'nonce-{nonce}'" if nonce else "'none'"
    resp.headers["Content-Security-Policy"] = (
        f"default-src 'none'; script-src {src}; style-src {src}; connect-src 'self'; img-src data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers["Cache-Control"] = "no-store"
    return resp


def page(live) -> web.Response:
    nonce = secrets.token_urlsafe(16)
    return _secured(web.Response(text=live.page(nonce), content_type="text/html", charset="utf-8"), nonce)


def login_form(status: int = 401, wrong: bool = False) -> web.Response:
    nonce = secrets.token_urlsafe(16)
    note = "<p class=wrong>That token is not this proxy's.</p>" if wrong else ""
    html = f"""<!doctype html><html lang=en><head><meta charset=utf-8><title>toolproxy</title>
<style nonce="{nonce}">body{{font:15px system-ui,sans-serif;margin:4em auto;max-width:28em;color:#222}}
input{{font:inherit;padding:.4em;width:100%;box-sizing:border-box;margin:.5em 0}}.wrong{{color:#b00}}</style></head>
<body><h1>toolproxy</h1><p>This proxy was started with <code>--auth-token</code>. Enter that token to open its live page
(it is kept as a cookie for this page only).</p>{note}
<form method=post action="/_toolproxy/login"><input type=password name=token autocomplete=current-password autofocus>
<input type=submit value="Open the live page"></form></body></html>"""
    return _secured(web.Response(text=html, status=status, content_type="text/html", charset="utf-8"), nonce)


# A token form is a few dozen bytes; anything larger is not one.
FORM_MAX = 4096


async def read_form(request: web.BaseRequest, body_timeout: float) -> dict[str, str] | web.StreamResponse:
    """The form's fields, read within `--client-body-timeout` in all and at most FORM_MAX bytes;
    else the answer already sent (408, 413). A client trickling a form must not hold a connection
    (and its handler) open for ever: the login route is open to anyone who can reach the proxy."""
    too_large = "a login form is at most 4096 bytes\n"
    if request.content_length is not None and request.content_length > FORM_MAX:
        return await _refuse_form(request, 413, too_large)
    body = bytearray()
    try:
        async with asyncio.timeout(body_timeout):
            while chunk := await request.content.readany():
                body += chunk
                if len(body) > FORM_MAX:
                    return await _refuse_form(request, 413, too_large)
    except TimeoutError:
        return await _refuse_form(
            request, 408, f"the login form did not arrive within {body_timeout:g}s (--client-body-timeout)\n"
        )
    if request.content_type != "application/x-www-form-urlencoded":
        return {}
    return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "surrogateescape"), errors="surrogateescape").items()}


async def _refuse_form(request: web.BaseRequest, status: int, message: str) -> web.StreamResponse:
    """Sent, then the connection closed: aiohttp would otherwise go on reading the rest of the
    body for its lingering time, which is the wait this bounds."""
    resp = web.Response(status=status, text=message)
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    if request.transport is not None:
        request.transport.close()
    return resp


async def login(request: web.Request, token: str | None, body_timeout: float) -> web.StreamResponse:
    """POST token=... (the form) or GET ?token=... (scripts): set the cookie, go to the page."""
    if token is None:
        return _to_page()
    if request.method == "POST":
        form = await read_form(request, body_timeout)
        if isinstance(form, web.StreamResponse):
            return form
        given = form.get("token")
    else:
        given = request.query.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()):
        return login_form(401, wrong=given is not None)
    resp = _to_page()
    resp.set_cookie(
        COOKIE, cookie_value(token), path="/_toolproxy/", httponly=True, samesite="Strict", secure=request.secure
    )
    return _secured(resp)


def _dumps(obj) -> str:
    """orjson for the page's JSON: polled every few seconds, it is the page's main cost to the proxy."""
    return orjson.dumps(obj).decode()


def _to_page() -> web.Response:
    return web.Response(status=303, headers={"Location": "/_toolproxy/"})


async def unauthorised(request: web.Request, name: str, token: str, body_timeout: float) -> web.Response | None:
    """For a caller without the header or the cookie: the login route, or a browser's form; None
    for everything else (the caller answers 401 as for any admin route)."""
    if name == "login":
        return await login(request, token, body_timeout)
    if name == "" and wants_html(request):
        return login_form()
    return None


async def answer(state: ProxyState, request: web.BaseRequest) -> web.StreamResponse:
    """The answer to a request under ADMIN_PREFIX: refused as the Host/Origin check says, let in
    by the token or the page's cookie (or shown the way to them), then routed."""
    refused = state.exposure.refusal(request.method, request.headers)
    if refused is not None:
        return web.Response(status=403, body=error_body(refused[2], refused[1]), content_type="application/json")
    token = state.config.auth_token
    if token is not None and not presented_token(request.headers, token)[0] and not has_cookie(request, token):
        gate = await unauthorised(
            request,
            request.raw_path[len(ADMIN_PREFIX) :].split("?")[0].strip("/"),
            token,
            state.config.client_body_timeout,
        )
        if gate is not None:
            return gate
        # The counters name the upstream and the data directory: not for anonymous callers.
        state.refusals.count(ADMIN_UNAUTHORIZED)
        return web.Response(
            status=401,
            body=error_body(
                "this toolproxy requires a token for its admin routes too: send 'X-Toolproxy-Token: <token>'",
                "toolproxy_unauthorized",
            ),
            content_type="application/json",
        )
    return await route(state, request)


async def route(state: ProxyState, request: web.Request) -> web.Response:
    """The route the path names (the caller has checked the token); the live page's only when it
    is on (`--no-live-page` turns it off)."""
    name = request.path[len(ADMIN_PREFIX) :].strip("/")
    if state.live is not None:
        page_route = await live_route(request, name, state)
        if page_route is not None:
            return page_route
    if name in ("health", "stats", ""):
        return await stats(state, name)
    return web.json_response(
        {"error": {"message": f"no admin route {request.path!r}; try {ADMIN_PREFIX}health"}}, status=404
    )


async def stats(state: ProxyState, name: str) -> web.Response:
    snap = state.snapshot()
    if state.peers is not None:
        snap = await state.peers.merged(snap)
    # This process's own evidence, not a merge: it is the one that just refreshed it.
    snap["upstream_health"] = await state.upstream_health.report()
    # The status is the proxy's own health (recording): an unreachable upstream is reported
    # above but answered 200, since restarting or bypassing the proxy would not bring it back;
    # so are a group's partial counts (a worker was killed), since the proxy still serves and records.
    status = 200 if (name != "health" or snap["status"] in ("ok", "partial")) else 503
    return web.json_response(snap, status=status)


async def live_route(request: web.Request, name: str, state: ProxyState) -> web.Response | None:
    """The live page's routes, or None for another name. Under `serve --workers N` its report and
    exchanges come from every worker's classifier (the peers' sockets)."""
    live = state.live
    peers = state.peers.peer_live_sockets if state.peers is not None else None
    if name == "" and wants_html(request):
        return page(live)
    if name == "login":
        return await login(request, state.config.auth_token, state.config.client_body_timeout)
    if name == "live":
        q = request.query
        try:
            limit = max(1, min(int(q.get("limit", "100")), 1000))
        except ValueError:
            limit = 100
        report = await asyncio.get_running_loop().run_in_executor(
            None, live.report, q.get("run") or None, q.get("outcome") or None, limit, peers
        )
        return _secured(web.json_response(report, dumps=_dumps))
    if name.startswith("exchange/"):
        found = await asyncio.get_running_loop().run_in_executor(None, live.detail, name[len("exchange/") :], peers)
        if found is None:
            return _secured(
                web.json_response(
                    {
                        "error": {
                            "message": "not among the recent exchanges kept in memory; "
                            "after `toolproxy analyze`, `toolproxy show ID` has every one"
                        }
                    },
                    status=404,
                )
            )
        return _secured(web.json_response(found, dumps=_dumps))
    return None
