"""Spans out of a running proxy, never in the way of the traffic (docs/export.md#never-in-the-way).

The writer thread hands every record it has written to `SpanShipper.observe`, which only appends
it to a bounded inbox (or counts it dropped when the inbox is full). A feeder thread encodes the
records (one orjson call each) and passes them in batches to an exporter *process*, which builds
their spans (toolproxy/otlp/spans.py) and sends them with the official OpenTelemetry OTLP/HTTP
exporter (protobuf). Building and encoding a span costs several times what forwarding the request
did, so in a thread of the proxy it would take the proxy's own CPU (the GIL); in a process of its
own, at a lower CPU priority, the proxy pays an encode per record. When the receiver is slow or
down, the exporter's retries hold only that process; the pipe and then the inbox fill, further
spans are dropped and counted, and forwarding goes on as before. What happened is in the proxy's
stats under "otlp".
"""

from __future__ import annotations

import collections
import importlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import orjson
from yarl import URL

from toolproxy import __version__
from toolproxy.otlp.spans import SpanData, span_of
from toolproxy.record.model import encode_record
from toolproxy.runtime.children import start_child

INBOX = 4_096
BATCH = 256
INTERVAL = 1.0  # seconds between sends when fewer than BATCH spans are waiting
TRACES_PATH = "/v1/traces"
ERROR_CHARS = 500


class EndpointError(ValueError):
    """An --otlp-endpoint a user must fix."""


def traces_url(endpoint: str) -> str:
    """The URL spans are POSTed to: a collector's root gets the standard /v1/traces path."""
    url = URL(endpoint.strip())
    if url.scheme not in ("http", "https") or not url.host:
        raise EndpointError(f"the OTLP endpoint must be an http(s) URL, e.g. http://127.0.0.1:4318 (got {endpoint!r})")
    if url.path in ("", "/"):
        url = url.with_path(TRACES_PATH)
    return str(url)


def missing_sdk() -> str | None:
    """Why spans cannot be sent from this installation, or None when they can."""
    try:
        for module in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
            importlib.import_module(module)
    except ImportError as exc:
        return (
            f"the OpenTelemetry exporter is not installed ({exc.name}); "
            "install it with: pip install 'toolproxy-recorder[otlp]'"
        )
    return None


class _LastError(logging.Handler):
    """Keeps the exporter's last complaint for the stats instead of printing it to the proxy's terminal."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.message = record.getMessage()[:500]
        except Exception:  # noqa: BLE001 - a malformed log call must not break the export thread
            self.message = str(record.msg)[:500]


class Exporter:
    """SpanData batches -> one OTLP/HTTP request each, through the SDK's exporter."""

    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.errors = _LastError()
        log = logging.getLogger("opentelemetry")
        log.addHandler(self.errors)
        log.propagate = False
        # Headers for the receiver (e.g. an API key) come from OTEL_EXPORTER_OTLP_HEADERS, never argv.
        self._exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
        attributes = {"service.version": __version__}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "toolproxy"
        self._resource = Resource.create(attributes)
        self._scope = InstrumentationScope("toolproxy", __version__)

    def send(self, spans: list[SpanData]) -> bool:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return self._exporter.export([self._readable(s) for s in spans]) == SpanExportResult.SUCCESS

    def last_error(self) -> str | None:
        return self.errors.message

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def _readable(self, span: SpanData):
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

        sampled = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=sampled)
        links = [Link(SpanContext(trace, linked, is_remote=True, trace_flags=sampled)) for trace, linked in span.links]
        status = Status(StatusCode.ERROR, span.error) if span.error is not None else Status(StatusCode.UNSET)
        return ReadableSpan(
            span.name,
            context=context,
            parent=None,
            resource=self._resource,
            attributes=span.attributes,
            events=[Event(name, attrs, at) for name, at, attrs in span.events],
            links=links,
            kind=SpanKind.CLIENT,
            status=status,
            start_time=span.start_ns,
            end_time=span.end_ns,
            instrumentation_scope=self._scope,
        )


class SpanShipper:
    """The proxy's side: takes written records and feeds them to the exporter process."""

    def __init__(
        self,
        endpoint: str,
        *,
        content: bool = False,
        stack: Callable[[], str | None] = lambda: None,
        inbox: int = INBOX,
        batch: int = BATCH,
        interval: float = INTERVAL,
        timeout: float = 10.0,
    ) -> None:
        self.endpoint = traces_url(endpoint)
        self.content = content
        self._stack = stack
        self._inbox: collections.deque = collections.deque()
        self._inbox_max = inbox
        self._batch = batch
        self._interval = interval
        self._timeout = timeout
        self._wake = threading.Event()
        self._stop = False
        ctx = multiprocessing.get_context("spawn")
        self._ctx = ctx
        # Written by the exporter process only; read here for the stats.
        self._done = ctx.Array("q", 3, lock=False)  # exported, failed, unbuilt
        self._error = ctx.Array("c", ERROR_CHARS, lock=False)
        self._proc = None
        self._pipe = None
        self.observed = 0
        self.sent = 0  # records handed to the exporter process
        self.dropped = 0  # the inbox was full (the receiver or the exporter could not keep up), or lost at shutdown
        self.unencodable = 0
        self._feeder = threading.Thread(target=self._feed, name="toolproxy-otlp", daemon=True)

    def start(self) -> None:
        out, self._pipe = self._ctx.Pipe(duplex=False)
        self._proc = self._ctx.Process(
            target=_export_loop,
            name="toolproxy-otlp",
            args=(out, self.endpoint, self.content, self._timeout, self._done, self._error),
            daemon=True,
        )
        start_child(self._proc)
        out.close()
        self._feeder.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Send what is waiting (for at most `timeout` seconds: a receiver that is down must not
        hold up the proxy's shutdown), then stop the exporter process."""
        self._stop = True
        self._wake.set()
        if self._feeder.is_alive():
            self._feeder.join(timeout)
        if self._proc is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(timeout)
        self.dropped += len(self._inbox) + self._in_flight()
        self._inbox.clear()
        self.sent = sum(self._done)  # what was in flight is counted dropped now, not pending

    def observe(self, rec: Any, line: bytes | None = None, classifiable: bool = True) -> None:
        """Called by the writer thread per written record: an append, nothing more. The writer's
        encoded line is not reused: it may hold chunk references only the segment can resolve."""
        if rec.kind != "exchange":
            return
        self.observed += 1
        if len(self._inbox) >= self._inbox_max:
            self.dropped += 1
            return
        self._inbox.append(rec)
        if len(self._inbox) >= self._batch:
            self._wake.set()

    def report(self) -> dict[str, Any]:
        exported, failed, unbuilt = self._done
        return {
            "endpoint": self.endpoint,
            "content": self.content,
            "observed": self.observed,
            "exported": exported,
            "pending": len(self._inbox) + self._in_flight(),
            "dropped": self.dropped,
            "failed": failed,
            "unbuilt": unbuilt + self.unencodable,
            "last_error": self._error.value.decode("utf-8", "replace") or None,
        }

    def _in_flight(self) -> int:
        return max(0, self.sent - sum(self._done))

    def _feed(self) -> None:
        while True:
            if not self._stop:
                self._wake.wait(self._interval)
                self._wake.clear()
            while self._inbox:
                lines = []
                while self._inbox and len(lines) < self._batch:
                    rec = self._inbox.popleft()
                    try:
                        lines.append(encode_record(rec))
                    except Exception:  # noqa: BLE001 - the writer dropped it too; counted, never sent
                        self.unencodable += 1
                try:
                    self._pipe.send(
                        (self._stack(), lines)
                    )  # blocks while the exporter is behind: the inbox then bounds memory
                except (OSError, ValueError):
                    return  # the exporter process is gone: what waits is counted dropped at stop
                self.sent += len(lines)
                if not self._stop and len(self._inbox) < self._batch:
                    break
            if self._stop:
                try:
                    self._pipe.send(None)
                except (OSError, ValueError):
                    pass
                return


def _export_loop(pipe, endpoint: str, content: bool, timeout: float, done, error) -> None:
    """The exporter process: batches of encoded records in, spans out to the receiver."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(10)  # the proxy's requests come first when the machine is busy
    except OSError:
        pass

    def fail(message: str) -> None:
        error.value = message.encode("utf-8", "replace")[: ERROR_CHARS - 1]

    try:
        exporter = Exporter(endpoint, timeout)
    except Exception as exc:  # noqa: BLE001 - shown in the stats; the proxy goes on without spans
        fail(f"cannot start the OTLP exporter: {type(exc).__name__}: {exc}")
        exporter = None
    while True:
        try:
            msg = pipe.recv()
        except EOFError:
            break
        if msg is None:
            break
        stack, lines = msg
        spans = []
        for line in lines:
            try:
                spans.append(span_of(orjson.loads(line), content=content, stack=stack))
            except Exception as exc:  # noqa: BLE001 - one odd record costs its span only
                done[2] += 1
                fail(f"cannot build a span: {type(exc).__name__}: {exc}")
        if not spans:
            continue
        ok = False
        if exporter is not None:
            try:
                ok = exporter.send(spans)
            except Exception as exc:  # noqa: BLE001 - whatever the exporter raises, export goes on
                fail(f"{type(exc).__name__}: {exc}")
        if ok:
            done[0] += len(spans)
        else:
            done[1] += len(spans)
            fail(
                (exporter.last_error() if exporter is not None else None)
                or error.value.decode()
                or "the receiver refused the spans"
            )
    if exporter is not None:
        exporter.shutdown()
