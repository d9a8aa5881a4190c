"""How far the proxy goes to be sure an answered exchange is on disk.

`--durability sync`: the client must not see a complete response before its record is fsynced,
yet it should see everything else at once (a stalled upstream's first event must not wait for
its second). So every chunk is forwarded as it arrives and only the end of the response waits:

- a response with a Content-Length ends with the byte that reaches it: the chunk carrying that
  byte is held (`LastBytes`), and a response that is headers only (HEAD, 204, 304, length 0)
  holds its headers;
- a chunked response ends with its zero-length terminating chunk, and a close-delimited one
  (HTTP/1.0) with the connection's close: the handler sends either only after the fsync.

Whatever the protocol inside (SSE `[DONE]`, Anthropic `message_stop`, Ollama's `"done": true`),
an HTTP client cannot take the message for complete without that end, so no protocol-specific
terminal event needs to be recognised.

`--durability group` holds the end the same way whenever its record could not reach the kernel
within the crash bound (record/writer.py): while the writer is `behind` or `writing_large` (a
response that is under way when either turns true is held from its next chunk on, `late_hold`),
and for an exchange with a body spilled past `--spill-above`, whose own record takes longer to
copy than the bound. `--on-record-failure block` then cuts the connection
instead of sending the end, and refuses new requests while recording fails. (An HTTP/1.0 client
reading until the close cannot tell a cut from an end; no proxy can change that.)
"""

from __future__ import annotations

from toolproxy.proxy.flow import Addon, Flow
from toolproxy.record.spill import SpilledBody
from toolproxy.record.writer import SegmentWriter


def expected_body_length(method: str, status: int, headers) -> int | None:
    """Bytes of body the client will be sent, if its framing says so in advance; None for chunked or until-close."""
    if method == "HEAD" or status < 200 or status in (204, 304):
        return 0
    for k, v in headers:
        if k.lower() == "content-length":
            v = v.strip()
            return int(v) if v.isdigit() else None
    return None


class LastBytes:
    """Passes a response's chunks through, keeping back those that complete its Content-Length."""

    __slots__ = ("remaining", "held", "headers_only")

    def __init__(self, expected: int | None) -> None:
        self.remaining = expected
        self.held = b""
        # Nothing but headers to send: they are the response's end, so they wait instead.
        self.headers_only = expected == 0

    def take(self, chunk: bytes) -> bytes:
        """The part of this chunk to send now."""
        if self.remaining is None:
            return chunk
        self.remaining -= len(chunk)
        if self.remaining > 0:
            return chunk
        self.held += chunk
        return b""


def late_hold(flow: Flow, sent: int) -> LastBytes:
    """Hold the end of a response already under way (`sent` bytes of its body have gone): it
    becomes durable, its end waiting for its record."""
    flow.durable = True
    expected = expected_body_length(flow.request.method, flow.out_status, flow.out_headers)
    flow.hold = LastBytes(None if expected is None else expected - sent)
    return flow.hold


class Durability(Addon):
    """Holds the end of each durable response: every one under `--durability sync` (the flow is
    marked when it is made), and in group mode every one answered while the writer is `behind` or
    `writing_large`, or whose request body was spilled, so a crash cannot take the records of
    responses that finished long before it. (The handler does the same for a response during
    which either turns true, or whose own body spills: `late_hold`.)"""

    def __init__(self, writer: SegmentWriter) -> None:
        self.writer = writer

    def response_headers(self, flow: Flow, resp) -> None:
        if not flow.durable:
            writer = self.writer
            if not (writer.behind or writer.writing_large or isinstance(flow.rec.request_body, SpilledBody)):
                return
            flow.durable = True
        flow.hold = LastBytes(expected_body_length(flow.request.method, flow.out_status, flow.out_headers))


class RecordingGuard(Addon):
    """`--on-record-failure block`: no new exchange is served while recording fails."""

    def __init__(self, writer: SegmentWriter) -> None:
        self.writer = writer

    def request_headers(self, flow: Flow) -> None:
        if self.writer.stats.degraded:
            flow.refuse(
                503,
                "recording_failed",
                f"toolproxy cannot record right now ({self.writer.stats.last_error}) and was started with "
                "--on-record-failure block, so it refuses to serve unrecorded traffic",
                "recording_unavailable",
            )
