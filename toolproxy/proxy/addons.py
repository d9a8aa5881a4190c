"""The proxy's addons, in one ordered list: the order their hooks run and their services start.

Hooks run in list order (counters first: they see every flow, refused ones included; the
recorder last: it sees what every other addon did). Services start in list order and stop in
reverse, so the record listeners (live view, OTLP) come first and stop last: the writers' final
records, flushed at their stop, still reach them. Masking and the housekeeper feed the writer
and stop before it; the upstream session comes before the stack watcher that probes through it.
"""

from __future__ import annotations

from typing import Any, Callable

from toolproxy.otlp.shipper import SpanShipper
from toolproxy.proxy import refusals
from toolproxy.proxy.admission import OriginFormOnly, UpstreamKey
from toolproxy.proxy.auth import Auth
from toolproxy.proxy.condition import ConditionAddon
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.diskguard import DiskBudgetGuard
from toolproxy.proxy.durability import Durability, RecordingGuard
from toolproxy.proxy.flow import Addon, Service
from toolproxy.live.view import LiveView
from toolproxy.proxy.logline import log_line
from toolproxy.proxy.modelswap import ModelSwap
from toolproxy.proxy.pool import upstream_session
from toolproxy.proxy.recorder import Recorder
from toolproxy.proxy.spillmask import SpillMasking
from toolproxy.proxy.stackwatch import StackWatch
from toolproxy.proxy.state import ProxyState
from toolproxy.record.housekeeping import Housekeeper
from toolproxy.record.masking import Masker, load_key, parse_rules
from toolproxy.record.model import Record
from toolproxy.record.sampling import SAMPLED_OUT, Sampler, load_sampler
from toolproxy.record.segments import REFUSALS_STREAM
from toolproxy.record.writer import SegmentWriter


class Part(Addon):
    """One of the proxy's parts that is not an addon of its own (a writer, a thread, a view) as
    one: what it starts and stops, what the stats show for it, the record hook it listens on.
    Its hook is the part's own method, called as it is."""

    def __init__(self, service: Service | None = None, *, stats_key: str | None = None,
                 report: Callable[[], Any] | None = None,
                 recorded: Callable[[Record, bytes | None, bool], None] | None = None) -> None:
        self._service = service
        self.stats_key = stats_key
        if report is not None:
            self.report = report
        if recorded is not None:
            self.recorded = recorded

    def service(self) -> Service | None:
        return self._service


def addons(config: ProxyConfig, state: ProxyState) -> list[Addon]:
    """The addons `config` asks for, in order (module doc); built once, at startup."""
    writer = state.writer
    out: list[Addon] = []
    view = LiveView(log=None if config.quiet else log_line) if config.live_page else None
    if view is not None:
        state.live = view
        if writer.log is not None:  # the live view's classifier prints each exchange's line, with its outcome
            writer.log = _unless(view.prints, log_line)
        out.append(Part(Service("live view", view.start, view.stop), recorded=view.observe))
    if config.otlp_endpoint:
        default_stack = config.condition_options.stack
        otlp = SpanShipper(config.otlp_endpoint, content=config.otlp_content,
                           stack=lambda: state.stacks.detected_stack() if state.stacks is not None else default_stack)
        out.append(Part(Service("otlp", otlp.start, otlp.stop, off_loop=True), stats_key="otlp", report=otlp.report,
                        recorded=otlp.observe))
    refused = _refusals_writer(config, state)
    out.append(Part(Service("refusals writer", refused.start, refused.close, off_loop=True),
                    stats_key="refused", report=state.refusals.report))
    sampler = load_sampler(config.sample, config.data_dir) if config.sample is not None else None
    masker = Masker(parse_rules(config.mask), load_key(config.data_dir)) if config.mask else None
    writer.transform = refused.transform = record_transform(sampler, masker)
    spill_masking = None
    if masker is not None:
        spill_masking = SpillMasking(writer, writer.transform)
        masker.stop = spill_masking.stopping
        writer.transform = spill_masking.writer_transform
    out.append(Part(Service("writer", writer.start, writer.close, off_loop=True),
                    stats_key="recording", report=lambda: _recording(config, writer, spill_masking)))
    if spill_masking is not None:
        out.append(Part(Service("spill masking", spill_masking.start, spill_masking.stop, off_loop=True)))
    housekeeper = _housekeeper(config, writer)
    if housekeeper is not None:
        out.append(Part(Service("housekeeper", housekeeper.start, housekeeper.stop, off_loop=True),
                        stats_key="lifecycle", report=housekeeper.snapshot))
    if sampler is not None:
        out.append(Part(stats_key="sampling", report=sampler.report))
    out += [state.watchdog, state.counters, state.exposure, state.upstream_health, state.pool]

    def open_session() -> None:
        state.session = upstream_session(state.pool, config.connect_timeout)

    out.append(Part(Service("upstream session", open_session, lambda: state.session.close())))
    if config.auth_token is not None:
        out.append(Auth(config.auth_token))
    if config.on_record_failure == "block":
        out.append(RecordingGuard(writer))
    if housekeeper is not None:
        out.append(DiskBudgetGuard(housekeeper))
    out.append(OriginFormOnly(config.upstream))
    if config.upstream_key is not None:
        out.append(UpstreamKey(config.upstream_key))
    out.append(ModelSwap(state.redactor))  # before the stack watcher: it fingerprints the model sent
    if config.fingerprint:
        state.stacks = StackWatch(config, writer, lambda: state.session, state.upstream_health)
        out.append(state.stacks)
    out.append(ConditionAddon(config.condition_options, state.stacks.detected_stack if state.stacks else lambda: None,
                         state.redactor))
    out.append(Durability(writer))
    out.append(Recorder(writer, config.spill_above, state.spill_dir, state.redactor, config.max_response,
                        state.refusals, spill_masking.submit if spill_masking is not None else None))
    return out


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


def _refusals_writer(config: ProxyConfig, state: ProxyState) -> SegmentWriter:
    """Refused requests' records: a writer of their own (no crash bound to keep: a slow poll)."""
    seg_bytes = refusals.segment_bytes(config.segment_bytes)
    refused = SegmentWriter(config.data_dir, window=1.0, max_queue=10 * refusals.RECORDS, segment_bytes=seg_bytes,
                            segment_seconds=config.segment_seconds, log=None if config.quiet else log_line,
                            poll=0.25, stream=REFUSALS_STREAM)
    refused.on_new_segment = refusals.rotation(config.data_dir, seg_bytes)
    state.refusals = refusals.RefusalBudget(refused, state.writer, config.upstream, config.default_run, state.redactor)
    return refused


def _housekeeper(config: ProxyConfig, writer: SegmentWriter) -> Housekeeper | None:
    """`--retain` / `--max-disk`: the housekeeper, wired to the writer, or None."""
    if config.retain_seconds is None and config.max_disk is None:
        return None
    housekeeper = Housekeeper(config.data_dir, retain=config.retain_seconds, max_bytes=config.max_disk,
                              on_full=config.on_disk_full, headroom=2 * config.segment_bytes, slack=config.segment_bytes)
    writer.on_new_segment = housekeeper.make_room
    if config.max_disk is not None and config.on_disk_full == "block":
        writer.budget = housekeeper  # enforced before each write, not only by the scan
    return housekeeper


def _recording(config: ProxyConfig, writer: SegmentWriter, spill_masking: SpillMasking | None) -> dict:
    w = writer.stats
    out = {
        "queue_depth": writer.queue_depth,
        "written": w.written,
        "dropped": w.dropped,
        "dropped_reasons": dict(w.dropped_reasons),
        "behind": writer.behind,
        "write_failures": w.write_failures,
        "segments": w.segments,
        "last_error": w.last_error,
        "durability": config.durability,
        "on_record_failure": config.on_record_failure,
    }
    if spill_masking is not None:
        out["masking"] = spill_masking.report()
    return out
