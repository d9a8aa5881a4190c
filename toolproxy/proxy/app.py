"""The aiohttp application: the proxy's state, its addons in order, and its lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from toolproxy.proxy.addons import addons
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.flow import Hooks, Service
from toolproxy.proxy.logline import log_line
from toolproxy.proxy.state import STATE, ProxyState
from toolproxy.record.writer import SegmentWriter


def exchange_writer(config: ProxyConfig, quiet: bool | None = None) -> SegmentWriter:
    """The writer of the exchanges' records, as `config` sets it (the stdio MCP wrapper's too,
    which is always quiet: its stdout is the protocol)."""
    return SegmentWriter(
        config.data_dir,
        window=config.commit_window,
        max_queue=config.max_queue,
        segment_bytes=config.segment_bytes,
        segment_seconds=config.segment_seconds,
        log=None if (config.quiet if quiet is None else quiet) else log_line,
    )


def make_state(config: ProxyConfig) -> ProxyState:
    """The state with its addons (`addons.addons`), their hooks sorted by phase once, here."""
    writer = exchange_writer(config)
    state = ProxyState(config, writer)
    state.hooks = Hooks(addons(config, state))
    writer.observe = state.refusals.writer.observe = state.hooks.observer()
    return state


def services(state: ProxyState) -> list[Service]:
    """The addons' services in start order (`addons` says why that order); they stop in
    reverse, each once, and only those that started."""
    return [s for s in (addon.service() for addon in state.hooks.addons) if s is not None]


def lifecycle(service: Service) -> Callable[[web.Application], AsyncIterator[None]]:
    """The service as an aiohttp cleanup context: started at the app's startup, stopped at its cleanup."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        service.start()
        yield
        if service.off_loop:
            await asyncio.get_running_loop().run_in_executor(None, service.stop)
        else:
            stopped = service.stop()
            if stopped is not None:
                await stopped

    return context


def make_app(config: ProxyConfig) -> web.Application:
    app = web.Application(client_max_size=config.max_body)
    state = make_state(config)
    app[STATE] = state
    app.cleanup_ctx.extend(lifecycle(service) for service in services(state))
    return app
