"""The listening server: aiohttp's low-level one, told of every request its HTTP parser rejects.

aiohttp answers a request it cannot parse (a bad request line, an invalid header, a line over
its limits) with a 400 of its own: no handler runs, so without this nothing would count it.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler


class _Handler(RequestHandler):
    def handle_error(self, request, status: int = 500, exc: BaseException | None = None, message: str | None = None):
        # Called for a parse error (an HttpProcessingError) and for a handler's own exceptions.
        manager = self._manager  # None once the connection is lost
        if isinstance(exc, HttpProcessingError) and manager is not None:
            manager.on_rejected(status, exc)
        return super().handle_error(request, status, exc, message)


class ListeningServer(web.Server):
    def __init__(self, handler, on_rejected: Callable[[int, BaseException], None], **kwargs) -> None:
        super().__init__(handler, **kwargs)
        self.on_rejected = on_rejected

    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)
