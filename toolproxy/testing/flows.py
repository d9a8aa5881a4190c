"""Flows, upstream responses and records built without sockets, and a context that runs addons'
hooks on them in the handler's order: an addon's unit test takes microseconds, not a server.

After mitmproxy's `test/tflow.py` (ready-made flows) and `test/taddons.py` (`context().cycle`).
A built flow is what the handler has once it has read the request line and headers: the
aiohttp request is aiohttp's own (`make_mocked_request`), labelled by `forward.label` with the
same code the proxy runs, so an addon sees exactly what it would see behind a socket.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict, CIMultiDictProxy

from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.flow import Addon, Cut, Flow, Hooks, Refusal
from toolproxy.proxy.forward import label
from toolproxy.proxy.headers import Redactor
from toolproxy.record.model import Record, encode_body, new_id, now

UPSTREAM = "http://127.0.0.1:9"  # never contacted: nothing here opens a socket
KEY = b"k" * 32  # the redactor's key: stand-ins are stable across tests


def config(**options) -> ProxyConfig:
    """A ProxyConfig for a flow's labels (default run, condition); the data directory is never
    written: no writer is made from it here."""
    options.setdefault("upstream", UPSTREAM)
    options.setdefault("data_dir", Path(tempfile.gettempdir()) / "toolproxy-flows-unused")
    return ProxyConfig(**options)


def flow(
    path: str = "/v1/chat/completions",
    *,
    method: str = "POST",
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
    cfg: ProxyConfig | None = None,
    durable: bool = False,
) -> Flow:
    """A flow at its request_headers phase (call inside a running loop: a flow knows its task).
    `path` is the raw target with its query, as a client sent it; `body` is set as if read."""
    cfg = cfg or config()
    request = make_mocked_request(method, path, headers=CIMultiDict(headers))
    f = Flow(request, cfg.upstream, cfg.total_timeout, durable)
    label(f, path, Redactor(KEY), cfg)
    f.body = body
    f.rec.request_body, f.rec.request_body_encoding = encode_body(body)
    f.rec.request_body_size = len(body)
    return f


@dataclass
class Response:
    """The upstream's response head as the response_headers hooks read it (aiohttp's
    ClientResponse has these attributes), and its body's chunks."""

    status: int = 200
    headers: CIMultiDictProxy = field(default_factory=lambda: CIMultiDictProxy(CIMultiDict()))
    chunks: tuple[bytes, ...] = ()
    reason: str = "OK"

    @classmethod
    def of(cls, status: int = 200, headers: Iterable[tuple[str, str]] = (), *chunks: bytes) -> Response:
        return cls(status, CIMultiDictProxy(CIMultiDict(headers)), chunks)


def response(status: int = 200, body: bytes = b"{}", content_type: str = "application/json") -> Response:
    """A whole response in one chunk, with its Content-Length."""
    return Response.of(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))], body)


def record(**fields) -> Record:
    """A written exchange's record, for the recorded hooks."""
    fields.setdefault("id", new_id())
    fields.setdefault("started_at", now())
    fields.setdefault("upstream", UPSTREAM)
    return Record(**fields)


@dataclass
class Outcome:
    """What a cycle ended with: the refusal or cut that stopped it (None: it ran to its end),
    and the bytes the client would have been sent."""

    refusal: Refusal | None = None
    cut: Cut | None = None
    client: bytes = b""


class Context:
    """Addons in order, their hooks sorted by phase as the proxy sorts them (`Hooks`)."""

    def __init__(self, *addons: Addon) -> None:
        self.hooks = Hooks(list(addons))

    async def cycle(self, f: Flow, resp: Response | None = None, error: tuple[str, str] | None = None) -> Outcome:
        """Run the request phases, then `resp`'s phases chunk by chunk, then the flow's end: its
        error hooks when a hook refused or cut, or `error` (kind, message) is given, else its
        response_end hooks. Stops where the handler would, and ends the flow exactly once."""
        hooks, out = self.hooks, Outcome()
        try:
            for phase in (hooks.request_headers, hooks.request):
                for hook in phase:
                    hook(f)
            if error is None and resp is not None:
                out.client = await self._respond(f, resp)
        except Refusal as r:
            out.refusal = r
            f.rec.set_error(r.kind, r.message)
            f.rec.client_status = r.status
        except Cut as c:
            out.cut = c
            f.rec.set_error(c.kind, c.message)
        if error is not None:
            f.rec.set_error(*error)
        hooks.end(f)
        return out

    async def _respond(self, f: Flow, resp: Response) -> bytes:
        hooks, rec = self.hooks, f.rec
        rec.status = resp.status
        f.upstream_headers = list(resp.headers.items())
        f.out_headers = list(f.upstream_headers)
        f.out_status, f.out_reason = resp.status, resp.reason
        for hook in hooks.response_headers:
            hook(f, resp)
        rec.client_status = f.out_status
        sent = []
        for chunk in resp.chunks:
            for hook in hooks.response_chunk:
                backlog = hook(f, chunk)
                if backlog is not None:
                    await backlog
            sent.append(f.stream(chunk) if f.stream is not None else chunk)
        rec.response_complete = True
        if f.stream is not None:
            sent.append(f.stream(b""))
        return b"".join(sent)

    def recorded(self, rec: Record, line: bytes | None = None, classifiable: bool = True) -> None:
        """What the writer does once it has written `rec`: tells the recorded hooks, in order."""
        observe = self.hooks.observer()
        if observe is not None:
            observe(rec, line, classifiable)
