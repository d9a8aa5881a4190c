"""How every command that listens does it: one function for serve's proxies and for playback.

aiohttp's low-level server, told of every request its HTTP parser rejects (it answers a bad
request line, an invalid header or a line over its limits with a 400 of its own: no handler
runs, so without this nothing would count it), with the settings every listener shares (the
request-head timeout, the line limit), and aiohttp's own log lines rewritten so that a rejected
request's bytes (a key in a header or a query) never reach stderr (`serverlog`), nor go back in
the 400's body. A command that built its own runner with aiohttp's defaults printed tracebacks
quoting `Authorization` headers and never timed out a client trickling its headers.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from toolproxy.proxy import serverlog
from toolproxy.proxy.headers import Redactor

# Pending connections the kernel may hold (capped by net.core.somaxconn): aiohttp's default of
# 128 makes a burst of a thousand agents connecting at once wait for SYN retransmits (1 s, 3 s).
BACKLOG = 4096
# The longest request line (and header line) accepted: aiohttp's own default, named here because
# what a client puts in the path (tags, a study's model name) must fit in it.
LINE_LIMIT = 8190


class CannotListen(Exception):
    """The address could not be bound; the message names it and says why."""


class _Handler(RequestHandler):
    def handle_error(self, request, status: int = 500, exc: BaseException | None = None, message: str | None = None):
        # Called for a parse error (an HttpProcessingError) and for a handler's own exceptions.
        manager = self._manager  # None once the connection is lost
        if isinstance(exc, HttpProcessingError):
            if manager is not None:
                manager.on_rejected(status, exc)
            # aiohttp's answer quotes the rejected line (an Authorization header, a query's key)
            # back: whatever sits between the client and here may keep it. Its verdict only.
            message = f"{status} {HTTPStatus(status).phrase}: {serverlog.what_was_wrong(exc)}"
        return super().handle_error(request, status, exc, message)


class ListeningServer(web.Server):
    def __init__(self, handler, on_rejected: Callable[[int, BaseException], None], **kwargs) -> None:
        super().__init__(handler, **kwargs)
        self.on_rejected = on_rejected

    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


def server_settings(header_timeout: float) -> dict:
    """What every listening server is told: its keep-alive timer is also the request-head timeout.

    aiohttp arms that timer when a connection opens or goes idle and disarms it only when a whole
    request head has arrived, so a client trickling its headers is closed when it fires.
    """
    # auto_decompress off: a transparent proxy forwards and records a compressed request body as
    # sent; aiohttp would inflate it (and fail with a 500 on a body that is not what it claims).
    return {
        "handler_cancellation": True,
        "access_log": None,
        "keepalive_timeout": header_timeout,
        "auto_decompress": False,
        "max_line_size": LINE_LIMIT,
        "max_field_size": LINE_LIMIT,
    }


async def listen(
    handler,
    host: str,
    port: int,
    *,
    header_timeout: float,
    redactor: Redactor,
    on_rejected: Callable[[int, BaseException], None],
    reuse_port: bool = False,
) -> web.ServerRunner:
    """`handler` answering on host:port, with the shared settings and log lines; CannotListen
    when the address is taken or invalid (nothing is left listening then)."""
    serverlog.install(redactor)
    runner = web.ServerRunner(ListeningServer(handler, on_rejected, **server_settings(header_timeout)))
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None, backlog=BACKLOG)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return runner
