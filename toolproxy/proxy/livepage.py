"""The /_toolproxy/ page and the JSON behind it, and how a browser gets past --auth-token.

A browser cannot send the X-Toolproxy-Token header, so with a token set the page offers a form:
the token is POSTed once (never in a URL that a history, a proxy log or a recording keeps) and
answered with an HttpOnly, SameSite=Strict cookie scoped to /_toolproxy/. The cookie holds an
HMAC of the token, not the token itself. Scripts that can only open a URL (a headless browser
taking a screenshot) may use /_toolproxy/login?token=...: it sets the same cookie and redirects
to the clean address at once.

The page is one package data file (toolproxy/live/page.html, inline CSS and JS, nothing from the network), sent
with a Content-Security-Policy that lets only its own nonce-tagged script and style run and lets
it fetch only from this origin. Everything a model or client wrote is put on the page through
textContent, never parsed as HTML.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from importlib import resources
from urllib.parse import parse_qs

import orjson
from aiohttp import web

COOKIE = "toolproxy_page"
_PAGE = resources.files("toolproxy.live").joinpath("page.html")


def cookie_value(token: str) -> str:
    return hmac.new(token.encode("utf-8", "surrogateescape"), b"toolproxy page session", hashlib.sha256).hexdigest()


def has_cookie(request: web.Request, token: str) -> bool:
    given = request.cookies.get(COOKIE)
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), cookie_value(token).encode())


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


def page() -> web.Response:
    nonce = secrets.token_urlsafe(16)
    html = _PAGE.read_text(encoding="utf-8").replace("{{nonce}}", nonce)
    return _secured(web.Response(text=html, content_type="text/html", charset="utf-8"), nonce)


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
        return await _refuse_form(request, 408, f"the login form did not arrive within {body_timeout:g}s (--client-body-timeout)\n")
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
    resp.set_cookie(COOKIE, cookie_value(token), path="/_toolproxy/", httponly=True, samesite="Strict",
                    secure=request.secure)
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


async def route(request: web.Request, name: str, live, token: str | None, body_timeout: float,
                peers=None) -> web.Response | None:
    """The page's routes (the caller has checked the token), or None for another admin name.
    `peers` lists the other workers' classifier sockets under `serve --workers N`."""
    if name == "" and wants_html(request):
        return page()
    if name == "login":
        return await login(request, token, body_timeout)
    if name == "live":
        q = request.query
        try:
            limit = max(1, min(int(q.get("limit", "100")), 1000))
        except ValueError:
            limit = 100
        report = await asyncio.get_running_loop().run_in_executor(
            None, live.report, q.get("run") or None, q.get("outcome") or None, limit, peers)
        return _secured(web.json_response(report, dumps=_dumps))
    if name.startswith("exchange/"):
        found = await asyncio.get_running_loop().run_in_executor(None, live.detail, name[len("exchange/"):], peers)
        if found is None:
            return _secured(web.json_response({"error": {"message": "not among the recent exchanges kept in memory; "
                                                                    "after `toolproxy analyze`, `toolproxy show ID` has every one"}}, status=404))
        return _secured(web.json_response(found, dumps=_dumps))
    return None
