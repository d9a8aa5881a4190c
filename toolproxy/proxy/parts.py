"""The proxy's parts that are not addons of their own (a writer, a thread, a view from a folder
below the proxy) as addons: each built from the settings and the state, wiring itself to what it
needs, and owning what it starts and stops, its key in the stats and the record hook it listens
on. `addons.addons` puts them in order among the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolproxy.live.view import LiveView
from toolproxy.otlp.shipper import SpanShipper
from toolproxy.proxy import refusals
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.flow import Addon, Service
from toolproxy.proxy.logline import log_line
from toolproxy.proxy.pool import upstream_session
from toolproxy.proxy.spillmask import SpillMasking
from toolproxy.proxy.state import ProxyState
from toolproxy.record.housekeeping import Housekeeper
from toolproxy.record.masking import Masker, load_key, parse_rules
from toolproxy.record.model import Record
from toolproxy.record.sampling import SAMPLED_OUT, Sampler, load_sampler
from toolproxy.record.segments import REFUSALS_STREAM
from toolproxy.record.writer import SegmentWriter


class Part(Addon):
    """One of the proxy's parts as an addon: what it starts and stops, what the stats show for it,
    the record hook it listens on. Its hook is the part's own method, called as it is."""

    def __init__(
        self,
        service: Service | None = None,
        *,
        stats_key: str | None = None,
        report: Callable[[], Any] | None = None,
        recorded: Callable[[Record, bytes | None, bool], None] | None = None,
    ) -> None:
        self._service = service
        self.stats_key = stats_key
        if report is not None:
            self.report = report
        if recorded is not None:
            self.recorded = recorded

    def service(self) -> Service | None:
        return self._service


class LivePage(Part):
    """The live page's view (toolproxy.live) on the recorded hook; the admin routes ask it as
    `state.live`. With serve's line per exchange, the view's classifier prints each exchange's
    line with its outcome, so the writer leaves those lines out."""

    def __init__(self, config: ProxyConfig, state: ProxyState) -> None:
        view = LiveView(log=None if config.quiet else log_line)
        super().__init__(Service("live view", view.start, view.stop), recorded=view.observe)
        state.live = view
        writer = state.writer
        if writer.log is not None:
            writer.log = _unless(view.prints, log_line)


class Otlp(Part):
    """`--otlp-endpoint`: the span shipper on the recorded hook, naming the stack fingerprinting
    found (else `--stack`)."""

    def __init__(self, config: ProxyConfig, state: ProxyState) -> None:
        default_stack = config.condition_options.stack
        otlp = SpanShipper(
            config.otlp_endpoint,
            content=config.otlp_content,
            stack=lambda: state.stacks.detected_stack() if state.stacks is not None else default_stack,
        )
        super().__init__(
            Service("otlp", otlp.start, otlp.stop, off_loop=True),
            stats_key="otlp",
            report=otlp.report,
            recorded=otlp.observe,
        )


class RefusedRecording(Part):
    """Refused requests' records: a writer of their own (no crash bound to keep: a slow poll), and
    the budget that decides which of them it records (`state.refusals`: the handler, the
    listener and the recorder hand it the refused ones)."""

    def __init__(self, config: ProxyConfig, state: ProxyState) -> None:
        seg_bytes = refusals.segment_bytes(config.segment_bytes)
        writer = SegmentWriter(
            config.data_dir,
            window=1.0,
            max_queue=10 * refusals.RECORDS,
            segment_bytes=seg_bytes,
            segment_seconds=config.segment_seconds,
            log=None if config.quiet else log_line,
            poll=0.25,
            stream=REFUSALS_STREAM,
        )
        writer.on_new_segment = refusals.rotation(config.data_dir, seg_bytes)
        state.refusals = refusals.RefusalBudget(
            writer, state.writer, config.upstream, config.default_run, state.redactor
        )
        super().__init__(
            Service("refusals writer", writer.start, writer.close, off_loop=True),
            stats_key="refused",
            report=state.refusals.report,
        )


class RecordSampling(Part):
    """`--sample`: which episodes are recorded whole and which leave a stub per exchange (the record
    transform asks it), and what the stats say of it."""

    def __init__(self, config: ProxyConfig) -> None:
        self.sampler = load_sampler(config.sample, config.data_dir)
        super().__init__(stats_key="sampling", report=self.sampler.report)


class Recording(Part):
    """The exchanges' writer, with what is done to each record before it reaches disk (sample,
    then mask) for the refused requests' writer too. With `--mask`, a record with a spilled body
    is masked on a thread of its own first (`spill_masking`, an addon of its own)."""

    def __init__(
        self,
        config: ProxyConfig,
        state: ProxyState,
        sampler: Sampler | None,
        scrub: Callable[[Record], Record] | None = None,
    ) -> None:
        writer = self.writer = state.writer
        self.config = config
        masker = masker_for(config)
        writer.transform = state.refusals.writer.transform = record_transform(sampler, masker, scrub)
        self.spill_masking = SpillMasking(writer, writer.transform, masker) if masker is not None else None
        # Where the recorder hands finished records, when not to the writer itself.
        self.submit = self.spill_masking.submit if self.spill_masking is not None else None
        super().__init__(
            Service("writer", writer.start, writer.close, off_loop=True), stats_key="recording", report=self._report
        )

    def _report(self) -> dict:
        writer, w = self.writer, self.writer.stats
        out = {
            "queue_depth": writer.queue_depth,
            "written": w.written,
            "dropped": w.dropped,
            "dropped_reasons": dict(w.dropped_reasons),
            "behind": writer.behind,
            "write_failures": w.write_failures,
            "segments": w.segments,
            "last_error": w.last_error,
            "durability": self.config.durability,
            "on_record_failure": self.config.on_record_failure,
        }
        if self.spill_masking is not None:
            out["masking"] = self.spill_masking.report()
        return out


class Housekeeping(Part):
    """`--retain` / `--max-disk`: the housekeeper, making room as the writer opens a segment and,
    under `--on-disk-full block`, asked before each write (not only by its scan)."""

    def __init__(self, config: ProxyConfig, writer: SegmentWriter) -> None:
        housekeeper = self.housekeeper = housekeeper_for(config, writer)
        super().__init__(
            Service("housekeeper", housekeeper.start, housekeeper.stop, off_loop=True),
            stats_key="lifecycle",
            report=housekeeper.snapshot,
        )


class UpstreamSession(Part):
    """The one client session to the upstream (`state.session`), open while the proxy runs."""

    def __init__(self, config: ProxyConfig, state: ProxyState) -> None:
        def open_session() -> None:
            state.session = upstream_session(state.pool, config.connect_timeout)

        super().__init__(Service("upstream session", open_session, lambda: state.session.close()))


def masker_for(config: ProxyConfig) -> Masker | None:
    """The `--mask` rules applied to every body recorded, or None without them."""
    return Masker(parse_rules(config.mask), load_key(config.data_dir)) if config.mask else None


def housekeeper_for(config: ProxyConfig, writer: SegmentWriter) -> Housekeeper:
    """`--retain` / `--max-disk` over `writer`'s segments: it makes room as the writer opens a
    segment and, under `--on-disk-full block`, is asked before each write."""
    housekeeper = Housekeeper(
        config.data_dir,
        retain=config.retain_seconds,
        max_bytes=config.max_disk,
        on_full=config.on_disk_full,
        headroom=2 * config.segment_bytes,
        slack=config.segment_bytes,
    )
    writer.on_new_segment = housekeeper.make_room
    if config.max_disk is not None and config.on_disk_full == "block":
        writer.budget = housekeeper
    return housekeeper


def record_transform(sampler: Sampler | None, masker: Masker | None, scrub: Callable[[Record], Record] | None = None):
    """What is done to each record before it reaches disk: sample, scrub (an MCP proxy's
    session stand-ins), then mask (a sampled-out exchange is a stub with nothing left to mask).
    None when none is asked for."""
    steps = []
    if sampler is not None:
        steps.append(sampler.record)
    if scrub is not None:
        steps.append(scrub)
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


def _unless(
    printed_elsewhere: Callable[[Record], bool], log: Callable[[Record], str]
) -> Callable[[Record], str | None]:
    """The writer's line per record, except for the records another printer prints."""
    return lambda rec: None if printed_elsewhere(rec) else log(rec)
