"""The aiohttp application: the proxy's state, its addons in order, and its lifecycle."""

from __future__ import annotations

import asyncio
import functools
import signal
import sys
from typing import TYPE_CHECKING, Callable

from aiohttp import web

from toolproxy import __version__
from toolproxy.calls.gcpause import settle_for_serving
from toolproxy.otlp.shipper import SpanShipper
from toolproxy.proxy import serverlog
from toolproxy.proxy.auth import Auth
from toolproxy.proxy.condition import Condition
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.diskguard import DiskBudgetGuard
from toolproxy.proxy.durability import Durability, RecordingGuard
from toolproxy.proxy import refusals
from toolproxy.proxy.forward import handle, serve_request
from toolproxy.proxy.listener import ListeningServer
from toolproxy.proxy.live import LiveView
from toolproxy.proxy.logline import log_line
from toolproxy.proxy.pool import upstream_session
from toolproxy.proxy.recorder import Recorder
from toolproxy.proxy.spillmask import SpillMasking
from toolproxy.proxy.stackwatch import StackWatch
from toolproxy.proxy.state import STATE, ProxyState
from toolproxy.record.model import Record
from toolproxy.record.housekeeping import Housekeeper
from toolproxy.record.masking import Masker, load_key, parse_rules
from toolproxy.record.sampling import SAMPLED_OUT, Sampler, load_sampler
from toolproxy.record.writer import REFUSALS_STREAM, SegmentWriter


if TYPE_CHECKING:
    from toolproxy.proxy.workers import Worker

# Pending connections the kernel may hold (capped by net.core.somaxconn): aiohttp's default of
# 128 makes a burst of a thousand agents connecting at once wait for SYN retransmits (1 s, 3 s).
BACKLOG = 4096


def record_transform(sampler: Sampler | None, masker: Masker | None):
    """What is done to each record before it reaches disk: sample, then mask (a sampled-out
    exchange is a stub with nothing left to mask). None when neither is asked for."""
    steps = []
    if sampler is not None:
        steps.append(sampler.record)
    if masker is not None:
        steps.append(masker.record)
    if not steps:
        return None

    def transform(rec: Record) -> Record:
        for step in steps:
            rec = step(rec)
            if rec.kind == SAMPLED_OUT:
                break
        return rec

    return transform


def _unless(printed_elsewhere: Callable[[Record], bool], log: Callable[[Record], str]) -> Callable[[Record], str | None]:
    """The writer's line per record, except for the records another printer prints."""
    return lambda rec: None if printed_elsewhere(rec) else log(rec)


def fan_out(observers: list) -> Callable[..., None] | None:
    """The writer's one observe hook (record, its encoded line, classifiable), telling every
    observer (live view, OTLP) in turn."""
    if len(observers) <= 1:
        return observers[0] if observers else None

    def observe(rec: Record, line: bytes | None = None, classifiable: bool = True) -> None:
        for see in observers:
            see(rec, line, classifiable)

    return observe


def make_state(config: ProxyConfig) -> ProxyState:
    """The state with its addons, in the order their hooks run (counters first: they see every flow)."""
    # With the live page on, its classifier prints each exchange's line, with the outcome.
    live = LiveView(log=None if config.quiet else log_line) if config.live_page else None
    otlp = SpanShipper(config.otlp_endpoint, content=config.otlp_content,
                       stack=lambda: state.stacks.detected_stack() if state.stacks is not None else config.condition_options.stack
                       ) if config.otlp_endpoint else None
    observers = [o.observe for o in (live, otlp) if o is not None]
    writer = SegmentWriter(
        config.data_dir,
        window=config.commit_window,
        max_queue=config.max_queue,
        segment_bytes=config.segment_bytes,
        segment_seconds=config.segment_seconds,
        log=None if config.quiet else log_line if live is None else _unless(live.prints, log_line),
        observe=fan_out(observers),
    )
    state = ProxyState(config, writer)
    # Refused requests' records: a writer of their own (no crash bound to keep: a slow poll).
    refusal_segment = refusals.segment_bytes(config.segment_bytes)
    refused = SegmentWriter(config.data_dir, window=1.0, max_queue=10 * refusals.RECORDS, segment_bytes=refusal_segment,
                            segment_seconds=config.segment_seconds, log=None if config.quiet else log_line,
                            observe=fan_out(observers), poll=0.25, stream=REFUSALS_STREAM)
    refused.on_new_segment = refusals.rotation(config.data_dir, refusal_segment)
    state.refusals = refusals.RefusalBudget(refused, writer, config.upstream, config.default_run, state.redactor)
    state.live = live
    state.otlp = otlp
    state.hooks.add(state.counters)
    if not state.exposure.off:
        state.hooks.add(state.exposure)
    state.hooks.add(state.upstream_health)
    if config.upstream_connections:
        state.hooks.add(state.pool)
    if config.auth_token is not None:
        state.hooks.add(Auth(config.auth_token))
    if config.on_record_failure == "block":
        state.hooks.add(RecordingGuard(writer))
    if config.sample is not None:
        state.sampler = load_sampler(config.sample, config.data_dir)
    masker = Masker(parse_rules(config.mask), load_key(config.data_dir)) if config.mask else None
    writer.transform = refused.transform = record_transform(state.sampler, masker)
    if masker is not None:
        state.spill_masking = SpillMasking(writer, writer.transform)
        masker.stop = state.spill_masking.stopping
        writer.transform = state.spill_masking.writer_transform
    if config.retain_seconds is not None or config.max_disk is not None:
        state.housekeeper = Housekeeper(config.data_dir, retain=config.retain_seconds, max_bytes=config.max_disk,
                                        on_full=config.on_disk_full, headroom=2 * config.segment_bytes,
                                        slack=config.segment_bytes)
        writer.on_new_segment = state.housekeeper.make_room
        if config.max_disk is not None and config.on_disk_full == "block":
            writer.budget = state.housekeeper  # enforced before each write, not only by the scan
        state.hooks.add(DiskBudgetGuard(state.housekeeper))
    if config.fingerprint:
        state.stacks = StackWatch(config, writer, lambda: state.session, state.upstream_health)
        state.hooks.add(state.stacks)
    state.hooks.add(Condition(config.condition_options, state.stacks.detected_stack if state.stacks else lambda: None,
                              state.redactor))
    state.hooks.add(Durability(writer))
    state.hooks.add(Recorder(writer, config.spill_above, state.spill_dir, state.redactor, config.max_response,
                             state.refusals, state.spill_masking.submit if state.spill_masking is not None else None))
    return state


def make_app(config: ProxyConfig) -> web.Application:
    app = web.Application(client_max_size=config.max_body)
    state = make_state(config)
    app[STATE] = state
    serverlog.install(state.redactor)

    async def on_startup(app: web.Application) -> None:
        state.writer.start()
        state.refusals.writer.start()
        if state.spill_masking is not None:
            state.spill_masking.start()
        if state.housekeeper is not None:
            state.housekeeper.start()
        if state.live is not None:
            state.live.start()
        if state.otlp is not None:
            state.otlp.start()
        state.watchdog.start()
        state.session = upstream_session(state.pool, config.connect_timeout)
        if state.stacks is not None:
            # In the background: serving starts now, whatever the upstream is doing. Its first
            # fingerprint is also the first word on whether the upstream is reachable.
            state.stacks.start()

    async def on_cleanup(app: web.Application) -> None:
        if state.stacks is not None:
            await state.stacks.stop()
        await state.upstream_health.stop()
        await state.watchdog.stop()
        if state.session is not None:
            await state.session.close()
        if state.housekeeper is not None:
            await asyncio.get_running_loop().run_in_executor(None, state.housekeeper.stop)
        if state.spill_masking is not None:
            await asyncio.get_running_loop().run_in_executor(None, state.spill_masking.stop)
        await asyncio.get_running_loop().run_in_executor(None, state.writer.close)
        await asyncio.get_running_loop().run_in_executor(None, state.refusals.writer.close)
        if state.otlp is not None:  # after the writer: the last records are observed by then
            await asyncio.get_running_loop().run_in_executor(None, state.otlp.stop)
        if state.live is not None:
            state.live.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def server_settings(config: ProxyConfig) -> dict:
    """What every entry point's server is told: its keep-alive timer is also the request-head timeout.

    aiohttp arms that timer when a connection opens or goes idle and disarms it only when a whole
    request head has arrived, so a client trickling its headers is closed when it fires.
    """
    # auto_decompress off: a transparent proxy forwards and records a compressed request body as
    # sent; aiohttp would inflate it (and fail with a 500 on a body that is not what it claims).
    return {"handler_cancellation": True, "access_log": None, "keepalive_timeout": config.client_header_timeout,
            "auto_decompress": False}


def runner_for(app: web.Application, config: ProxyConfig) -> web.AppRunner:
    """The runner for a proxy inside another program (demo, doctor)."""
    return web.AppRunner(app, **server_settings(config))


async def serve(config: ProxyConfig, worker: "Worker | None" = None) -> None:
    """Run until SIGINT/SIGTERM; prints where it listens and where it records (a worker leaves
    that to its supervisor and shares the port with its peers)."""
    app = make_app(config)
    if worker is not None:
        worker.attach(app, app[STATE])
    # aiohttp's low-level server with the handler bound to the state: the Application stays for
    # its lifecycle (startup/cleanup), but requests skip its router, middlewares and signals,
    # about a tenth of the CPU a forwarded request costs.
    app.freeze()
    await app.startup()
    settle_for_serving()
    server = ListeningServer(functools.partial(serve_request, app[STATE]), app[STATE].refusals.parser_rejected,
                             **server_settings(config))
    runner = web.ServerRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True,
                       reuse_port=worker is not None, backlog=BACKLOG)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await app.shutdown()
        await app.cleanup()
        raise SystemExit(f"toolproxy: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    if worker is None:
        print(banner(config, runner.addresses[0][1] if runner.addresses else config.port), flush=True)
    else:
        await worker.listening(app[STATE])
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
        if worker is None:
            print("toolproxy: shutting down, flushing records", file=sys.stderr, flush=True)
        await runner.cleanup()
        await app.shutdown()
        await app.cleanup()


def banner(config: ProxyConfig, port: int, workers: int = 1) -> str:
    """The line users (and tests) read the proxy's address from."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    group = f"{workers} workers, " if workers > 1 else ""
    return (
        f"toolproxy {__version__}: listening on http://{host}:{port} -> upstream {config.upstream}; "
        f"recording to {config.data_dir.resolve()} ({group}condition {config.condition}, durability {config.durability})"
    )


def run(config: ProxyConfig, worker: "Worker | None" = None) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config, worker))
    else:
        uvloop.run(serve(config, worker))
