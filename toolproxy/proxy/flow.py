"""The flow: one exchange's state, and the addons that hang on its phases.

Like mitmproxy's addons, each concern of the hot path (auth, the condition, stack watching,
counters, durability, recording) is a small object with a method per phase it cares about:

    request_headers(flow)        the request line and headers are known; the body is not read yet
    request(flow)                the body is read; a condition may rewrite what goes upstream
    response_headers(flow, resp) the upstream's status and headers arrived
    response_chunk(flow, chunk)  one chunk of the upstream's body, as received (may return an
                                 awaitable: backpressure, awaited before the next chunk is read)
    response_end(flow)           the upstream's body is complete
    error(flow)                  the exchange ended any other way (flow.rec.error_kind says how)
    recorded(rec, line, classifiable)
                                 the writer wrote a record (on the writer's thread: an addon
                                 that does more than append hands it to its own thread)

Exactly one of response_end and error runs per flow, once, so an addon that records or counts
there sees every exchange exactly once. A request-phase hook stops the exchange by calling
`flow.refuse(...)`. Hooks are plain functions (not coroutines): the per-chunk cost is a call.
Only the phases an addon overrides are called, so an addon costs nothing where it is silent.

An addon also owns what it starts and stops (`service`) and what `/_toolproxy/stats` shows for
it (`stats_key` and `report`); the proxy's addons, in order, come from `addons.addons`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web

from toolproxy.record.model import CLIENT_CLOSED, USER_INTERRUPT, Record, new_id, now

PHASES = ("request_headers", "request", "response_headers", "response_chunk", "response_end", "error", "recorded")


class Refusal(Exception):
    """Raised by `Flow.refuse`: the proxy answers itself instead of forwarding."""

    def __init__(self, status: int, kind: str, message: str, code: str, family: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.code = status, kind, message, code
        self.family = family  # the protocol whose error shape the answer takes (None: OpenAI's)


class Cut(Exception):
    """Raised by a response_chunk hook: the response stops here, the client keeps what it got
    (the handler closes the connection) and the record says why (`kind`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class Flow:
    """One exchange, from the client's request to its one record."""

    __slots__ = (
        "request",
        "rec",
        "t0",
        "body",
        "up_path",
        "up_query",
        "up_headers",
        "transform",
        "stream",
        "out_status",
        "out_reason",
        "out_headers",
        "upstream_headers",
        "spool",
        "pieces",
        "client_chunks",
        "client_resp",
        "hold",
        "durable",
        "on_disk",
        "ended",
        "pool_wait",
        "pool_queued_at",
        "task",
        "deadline",
        "hard_deadline",
        "phase",
        "expired",
        "cut_by_user",
    )

    def __init__(
        self,
        request: web.Request,
        upstream: str,
        total_timeout: float | None,
        durable: bool = False,
        record: type[Record] = Record,
    ) -> None:
        self.request = request
        self.t0 = time.perf_counter()
        # `record`: the kind this proxy records (an McpRecord under `toolproxy mcp --upstream`).
        self.rec = record(id=new_id(), started_at=now(), upstream=upstream)
        # The request body: bytes, or a SpilledBody once it outgrew --spill-above.
        self.body: Any = b""
        self.up_path = ""
        self.up_query = ""
        self.up_headers: dict[str, str] = {}
        self.transform: Any = None  # the condition's ResponseTransform, when it rewrites the reply
        # What the client is sent: the upstream's status and headers unless an addon changes them.
        self.out_status = 0
        self.out_reason: str | None = None
        self.out_headers: list[tuple[str, str]] = []
        self.upstream_headers: list[tuple[str, str]] | None = None  # as the upstream sent them
        # bytes -> bytes for the client (called with b"" at the end for the tail), or None: as received.
        self.stream: Callable[[bytes], bytes] | None = None
        self.spool: Any = None  # the recorder's copy of the upstream's body (a spool.Spool)
        self.pieces: Any = None  # when each piece of it came (a record.pacing.PieceTimes)
        self.client_chunks: list[bytes] | None = None
        self.client_resp: web.StreamResponse | None = None
        # Durability's hold on the response's last bytes (see durability.LastBytes), or None.
        self.hold: Any = None
        # --durability sync: the record must be on disk before the client gets the end of any answer,
        # the proxy's own refusals included, so this is known before the first hook can refuse.
        self.durable = durable
        self.on_disk: asyncio.Future | None = None
        self.ended = False
        self.pool_wait: float | None = None  # ms spent waiting for a pooled upstream connection
        self.pool_queued_at: float | None = None  # set while it waits
        # Read by the Watchdog: the current phase's deadline, the --total-timeout one, and why it fired.
        self.task = asyncio.current_task()
        self.deadline: float | None = None
        self.hard_deadline = None if total_timeout is None else asyncio.get_running_loop().time() + total_timeout
        self.phase = "first_byte"
        self.expired: str | None = None
        # Set while in flight when the user interrupted the harness (ProxyState.user_interrupted):
        # how, in words. A client that then hangs up was stopped by the user, not failed by the stack.
        self.cut_by_user: str | None = None

    def client_gone(self, message: str) -> None:
        """The client ended the exchange before its answer was complete: by the user's interrupt
        when one came while it was in flight, else for reasons of its own (USER_INTERRUPT or
        CLIENT_CLOSED, toolproxy.record.model)."""
        if self.cut_by_user is not None:
            self.rec.set_error(USER_INTERRUPT, f"{self.cut_by_user}; {message}")
        else:
            self.rec.set_error(CLIENT_CLOSED, message)

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0

    @staticmethod
    def refuse(status: int, kind: str, message: str, code: str, family: str | None = None) -> NoReturn:
        raise Refusal(status, kind, message, code, family)


@dataclass(frozen=True)
class Service:
    """What a proxy starts before it serves and stops after it stopped listening."""

    name: str
    start: Callable[[], None]
    stop: Callable[[], Awaitable[None] | None]
    off_loop: bool = False  # stop blocks (joins a thread, fsyncs): run it in an executor


class Addon:
    """Base for the proxy's units; override only what you need (see the module doc)."""

    # The /_toolproxy/stats key this addon's report() fills, or None: it shows nothing there.
    stats_key: str | None = None
    # False: present for its service and its stats only; none of its hooks is called.
    hooked = True

    def request_headers(self, flow: Flow) -> None: ...
    def request(self, flow: Flow) -> None: ...
    def response_headers(self, flow: Flow, resp: Any) -> None: ...
    def response_chunk(self, flow: Flow, chunk: bytes) -> Awaitable | None: ...
    def response_end(self, flow: Flow) -> None: ...
    def error(self, flow: Flow) -> None: ...
    def recorded(self, rec: Record, line: bytes | None, classifiable: bool) -> None: ...

    def service(self) -> Service | None:
        """What this addon starts and stops with the proxy, or None."""
        return None

    def report(self) -> Any:
        return None

    def stats(self) -> dict:
        """Its entries of /_toolproxy/stats (one key unless an addon owns several)."""
        return {self.stats_key: self.report()} if self.stats_key is not None else {}


class Hooks:
    """The addons in order, and per phase the bound methods of those that override it: built
    when the list changes (at startup), so a phase costs one loop over the hooks it has."""

    def __init__(self, addons: list[Addon] | None = None) -> None:
        self.addons: list[Addon] = list(addons or ())
        self._rebuild()

    def add(self, addon: Addon) -> None:
        self.addons.append(addon)
        self._rebuild()

    def remove(self, addon: Addon) -> None:
        self.addons.remove(addon)
        self._rebuild()

    def _rebuild(self) -> None:
        for phase in PHASES:
            base = getattr(Addon, phase)
            # An override on the class or on the instance (an addon that hands a hook on as it is).
            setattr(
                self,
                phase,
                tuple(
                    hook
                    for a in self.addons
                    if a.hooked
                    for hook in (getattr(a, phase),)
                    if getattr(hook, "__func__", hook) is not base
                ),
            )

    def observer(self) -> Callable[[Record, bytes | None, bool], None] | None:
        """The writers' one observe callback: the recorded hooks in order (None: no addon
        listens, and the writer does no work for it)."""
        hooks = self.recorded
        if len(hooks) <= 1:
            return hooks[0] if hooks else None

        def observe(rec: Record, line: bytes | None = None, classifiable: bool = True) -> None:
            for see in hooks:
                see(rec, line, classifiable)

        return observe

    def end(self, flow: Flow) -> None:
        """Run response_end (no error) or error hooks, once per flow."""
        if flow.ended:
            return
        flow.ended = True
        for hook in self.error if flow.rec.error_kind is not None else self.response_end:
            hook(flow)
