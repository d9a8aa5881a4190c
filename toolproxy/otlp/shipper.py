"""Spans out of a running proxy, never in the way of the traffic (README: "OpenTelemetry").

The writer thread hands every record it has written to `SpanShipper.observe`, which only appends
it to a bounded inbox (or counts it dropped when the inbox is full). A thread of its own takes
records in batches, builds their spans (toolproxy/otlp/spans.py) and sends them with the official
OpenTelemetry OTLP/HTTP exporter (protobuf). The event loop never sees any of it. When the
receiver is slow or down, the exporter's retries hold only this thread; the inbox fills and further
spans are dropped and counted, and forwarding goes on as before. What happened is in the proxy's
stats under "otlp".
"""

from __future__ import annotations

import collections
import importlib
import logging
import os
import threading
from typing import Any, Callable

from yarl import URL

from toolproxy import __version__
from toolproxy.otlp.spans import SpanData, span_of

INBOX = 4_096
BATCH = 256
INTERVAL = 1.0  # seconds between sends when fewer than BATCH spans are waiting
TRACES_PATH = "/v1/traces"


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
        return (f"the OpenTelemetry exporter is not installed ({exc.name}); "
                "install it with: pip install 'toolproxy-recorder[otlp]'")
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
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        context = SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        status = Status(StatusCode.ERROR, span.error) if span.error is not None else Status(StatusCode.UNSET)
        return ReadableSpan(
            span.name, context=context, parent=None, resource=self._resource, attributes=span.attributes,
            events=[Event(name, attrs, at) for name, at, attrs in span.events], kind=SpanKind.CLIENT, status=status,
            start_time=span.start_ns, end_time=span.end_ns, instrumentation_scope=self._scope,
        )


class SpanShipper:
    """The proxy's side: takes written records, builds and sends their spans on its own thread."""

    def __init__(self, endpoint: str, *, content: bool = False, stack: Callable[[], str | None] = lambda: None,
                 inbox: int = INBOX, batch: int = BATCH, interval: float = INTERVAL, timeout: float = 10.0) -> None:
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
        self._exporter: Exporter | None = None
        self.observed = 0
        self.exported = 0
        self.dropped = 0  # the inbox was full: the receiver (or this thread) could not keep up
        self.failed = 0  # built and sent, but the receiver did not take them
        self.unbuilt = 0  # a record the span builder choked on
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="toolproxy-otlp", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Send what is waiting (for at most `timeout` seconds: a receiver that is down must not
        hold up the proxy's shutdown), then let go of the receiver."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)
        if self._exporter is not None:
            self._exporter.shutdown()  # also cuts short a retry the receiver is making us wait for
        self._thread.join(1.0)

    def observe(self, rec: Any) -> None:
        """Called by the writer thread per written record: an append, nothing more."""
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
        return {"endpoint": self.endpoint, "content": self.content, "observed": self.observed, "exported": self.exported,
                "pending": len(self._inbox), "dropped": self.dropped, "failed": self.failed, "unbuilt": self.unbuilt,
                "last_error": self.last_error}

    def _run(self) -> None:
        try:
            self._exporter = Exporter(self.endpoint, self._timeout)
        except Exception as exc:  # noqa: BLE001 - counted and shown in stats; the proxy goes on
            self.last_error = f"cannot start the OTLP exporter: {type(exc).__name__}: {exc}"
            self._stop = True
        while True:
            if not self._stop:
                self._wake.wait(self._interval)
                self._wake.clear()
            while self._inbox and self._exporter is not None:
                self._send(self._take())
                if not self._stop and len(self._inbox) < self._batch:
                    break
            if self._stop:
                self.dropped += len(self._inbox)
                self._inbox.clear()
                return

    def _take(self) -> list:
        taken = []
        while self._inbox and len(taken) < self._batch:
            taken.append(self._inbox.popleft())
        return taken

    def _send(self, records: list) -> None:
        stack = self._stack()
        spans = []
        for rec in records:
            try:
                spans.append(span_of(_fields(rec), content=self.content, stack=stack))
            except Exception as exc:  # noqa: BLE001 - one odd record costs its span only
                self.unbuilt += 1
                self.last_error = f"cannot build a span for {getattr(rec, 'id', '?')}: {type(exc).__name__}: {exc}"[:500]
        if not spans:
            return
        try:
            ok = self._exporter.send(spans)
        except Exception as exc:  # noqa: BLE001 - whatever the exporter raises, the proxy goes on
            ok = False
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
        if ok:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
            self.last_error = self._exporter.last_error() or self.last_error or "the receiver refused the spans"


def _fields(rec: Any) -> dict:
    """A Record's fields as the dict the span builder reads (the same shape as a segment line)."""
    return {name: getattr(rec, name) for name in rec.__slots__} if hasattr(rec, "__slots__") else vars(rec)
