"""How a proxy starts listening: one function for every command that runs one.

`serve`, `run`, `study`, `replay`, `demo`, `doctor` and `conformance` all forward and record
through `start_proxy`, so a request is parsed, timed, forwarded and recorded the same whichever
command the user started. Each used to build its own aiohttp runner with aiohttp's defaults: a
gzip-encoded request body reached the upstream inflated but still labelled gzip, the header
timeout did not apply and the HTTP parser's rejections went uncounted, only under `serve`'s own
listener did none of that happen. They listen through `listener.listen`, as playback does.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from toolproxy import __version__
from toolproxy.proxy.app import make_app
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.forward import serve_request
from toolproxy.proxy.listener import CannotListen, listen
from toolproxy.proxy.state import STATE, ProxyState
from toolproxy.runtime.eventloop import run_loop
from toolproxy.runtime.gcpause import settle_for_serving


@dataclass
class RunningProxy:
    """A started proxy: its state (addons, counters, writer) and where it listens."""

    app: web.Application
    runner: web.ServerRunner

    @property
    def state(self) -> ProxyState:
        return self.app[STATE]

    @property
    def port(self) -> int:
        return self.runner.addresses[0][1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        """Stop listening, then stop the addons (the writer flushes every record)."""
        await self.runner.cleanup()
        await self.app.shutdown()
        await self.app.cleanup()


async def start_proxy(
    config: ProxyConfig, *, reuse_port: bool = False, before_start: Callable[[web.Application], None] | None = None
) -> RunningProxy:
    """Start the proxy for `config` on this loop, listening once its addons have started.

    `before_start` may add to the application's lifecycle before it is frozen (a worker joins
    its group there). Raises CannotListen when the address is taken or invalid.
    """
    app = make_app(config)
    if before_start is not None:
        before_start(app)
    # aiohttp's low-level server with the handler bound to the state: the Application stays for
    # its lifecycle (startup/cleanup), but requests skip its router, middlewares and signals,
    # about a tenth of the CPU a forwarded request costs.
    app.freeze()
    try:
        await app.startup()
    except BaseException:
        await app.cleanup()  # what started stops again, in reverse: no writer thread outlives it
        raise
    state = app[STATE]
    try:
        runner = await listen(
            functools.partial(serve_request, state),
            config.host,
            config.port,
            header_timeout=config.client_header_timeout,
            redactor=state.redactor,
            on_rejected=state.refusals.parser_rejected,
            reuse_port=reuse_port,
        )
    except CannotListen:
        await app.shutdown()
        await app.cleanup()
        raise
    return RunningProxy(app, runner)


async def serve(
    config: ProxyConfig,
    join_group: Callable[[web.Application], None] | None = None,
    listening: Callable[[ProxyState], Awaitable[None]] | None = None,
) -> None:
    """Run until SIGINT/SIGTERM; prints where it listens and where it records. A worker of a
    group passes `join_group` and `listening` instead: it shares the port with its peers and
    its supervisor tells the user."""
    try:
        proxy = await start_proxy(config, reuse_port=join_group is not None, before_start=join_group)
    except CannotListen as exc:
        raise SystemExit(f"toolproxy: {exc}") from None
    settle_for_serving()
    if listening is None:
        print(banner(config, proxy.port), flush=True)
    else:
        await listening(proxy.state)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await stop.wait()
    finally:
        if listening is None:
            print("toolproxy: shutting down, flushing records", file=sys.stderr, flush=True)
        await proxy.stop()


def banner(config: ProxyConfig, port: int, workers: int = 1) -> str:
    """The line users (and tests) read the proxy's address from."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    group = f"{workers} workers, " if workers > 1 else ""
    return (
        f"toolproxy {__version__}: listening on http://{host}:{port} -> upstream {config.upstream}; "
        f"recording to {config.data_dir.resolve()} ({group}condition {config.condition}, durability "
        f"{config.durability})"
    )


def run(
    config: ProxyConfig,
    join_group: Callable[[web.Application], None] | None = None,
    listening: Callable[[ProxyState], Awaitable[None]] | None = None,
) -> None:
    run_loop(serve(config, join_group, listening))
