"""The aiohttp application: the proxy's state, its addons in order, and its lifecycle."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

from toolproxy.otlp.shipper import SpanShipper
from toolproxy.proxy import serverlog
from toolproxy.proxy.auth import Auth
from toolproxy.proxy.condition import ConditionAddon
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.diskguard import DiskBudgetGuard
from toolproxy.proxy.durability import Durability, RecordingGuard
from toolproxy.proxy import refusals
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
    state.hooks.add(ConditionAddon(config.condition_options, state.stacks.detected_stack if state.stacks else lambda: None,
                              state.redactor))
    state.hooks.add(Durability(writer))
    state.hooks.add(Recorder(writer, config.spill_above, state.spill_dir, state.redactor, config.max_response,
                             state.refusals, state.spill_masking.submit if state.spill_masking is not None else None))
    return state


@dataclass(frozen=True)
class Service:
    """What a proxy starts before it serves and stops after it stopped listening."""

    name: str
    start: Callable[[], None]
    stop: Callable[[], Awaitable[None] | None]
    off_loop: bool = False  # stop blocks (joins a thread, fsyncs): run it in an executor


def _nothing() -> None: ...


def services(state: ProxyState) -> list[Service]:
    """The proxy's services in start order; they stop in reverse, each once, and only those that
    started. The observers come first, so they stop last: the writers' final records (flushed at
    their stop) still reach the live view and the OTLP shipper. Masking and the housekeeper feed
    the writer and stop before it; the upstream session comes before the stack watcher that
    probes through it."""
    config = state.config
    out = []
    if state.live is not None:
        out.append(Service("live view", state.live.start, state.live.stop))
    if state.otlp is not None:
        out.append(Service("otlp", state.otlp.start, state.otlp.stop, off_loop=True))
    out.append(Service("refusals writer", state.refusals.writer.start, state.refusals.writer.close, off_loop=True))
    out.append(Service("writer", state.writer.start, state.writer.close, off_loop=True))
    if state.spill_masking is not None:
        out.append(Service("spill masking", state.spill_masking.start, state.spill_masking.stop, off_loop=True))
    if state.housekeeper is not None:
        out.append(Service("housekeeper", state.housekeeper.start, state.housekeeper.stop, off_loop=True))
    out.append(Service("watchdog", state.watchdog.start, state.watchdog.stop))
    out.append(Service("upstream health", _nothing, state.upstream_health.stop))

    def open_session() -> None:
        state.session = upstream_session(state.pool, config.connect_timeout)

    out.append(Service("upstream session", open_session, lambda: state.session.close()))
    if state.stacks is not None:
        # In the background: serving starts now, whatever the upstream is doing. Its first
        # fingerprint is also the first word on whether the upstream is reachable.
        out.append(Service("stack watch", state.stacks.start, state.stacks.stop))
    return out


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
    serverlog.install(state.redactor)
    app.cleanup_ctx.extend(lifecycle(service) for service in services(state))
    return app
