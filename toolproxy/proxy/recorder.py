"""The record of each exchange: the upstream's body tee'd as it passes, one record submitted at the end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from toolproxy.proxy.durability import expected_body_length
from toolproxy.proxy.flow import Addon, Cut, Flow
from toolproxy.proxy.headers import Redactor
from toolproxy.proxy.refusals import REFUSED, RefusalBudget
from toolproxy.proxy.spool import Spool
from toolproxy.record.model import encode_body, now
from toolproxy.record.pacing import EXTRA_KEY as PIECE_MS
from toolproxy.record.pacing import PieceTimes
from toolproxy.record.spill import SpilledBody
from toolproxy.record.writer import SegmentWriter


class Recorder(Addon):
    """Keeps the upstream's body (no parsing; spilled to a file when large; at most
    `--max-response`) and hands the finished record to the writer, or to `submit` when one is
    given (the masking of spilled bodies, proxy/spillmask.py).

    For a flow marked durable it submits with a waiter (`flow.on_disk`), which the handler awaits
    before sending the response's last bytes. A refused request goes to the refusal budget instead.
    """

    def __init__(
        self,
        writer: SegmentWriter,
        spill_above: int,
        spill_dir: str,
        redactor: Redactor,
        max_response: int,
        refusals: RefusalBudget,
        submit: Callable | None = None,
    ) -> None:
        self.writer = writer
        self.submit = submit or writer.submit
        self.redactor = redactor
        self.max_response = max_response
        self.spill_above = spill_above
        self.spill_dir = spill_dir
        self.refusals = refusals

    def response_headers(self, flow: Flow, resp) -> None:
        announced = expected_body_length(flow.request.method, resp.status, flow.upstream_headers)
        if announced is not None and announced > self.max_response:
            flow.refuse(
                502,
                "response_too_large",
                f"upstream {flow.rec.upstream} announced a response of {announced} bytes, more than toolproxy's "
                f"limit of {self.max_response}; raise it with --max-response",
                "response_too_large",
            )
        flow.spool = Spool(self.spill_above, self.spill_dir)
        flow.pieces = PieceTimes(flow.t0)

    def response_chunk(self, flow: Flow, chunk: bytes):
        spool = flow.spool
        if spool.size + len(chunk) > self.max_response:
            raise Cut(
                "response_too_large",
                f"the response was cut after {spool.size} bytes: it grew past toolproxy's limit of "
                f"{self.max_response} (--max-response); the client got those bytes and a closed connection",
            )
        flow.pieces.add(len(chunk))
        return spool.add(chunk)

    def response_end(self, flow: Flow) -> None:
        rec = flow.rec
        rec.ended_at = now()
        rec.duration_ms = flow.elapsed_ms()
        rec.pool_wait_ms = flow.pool_wait
        # Redacted here rather than on the way in: after the response, off the client's wait.
        rec.request_headers = self.redactor.record_headers(flow.request.raw_headers)
        if flow.upstream_headers is not None:
            rec.response_headers = self.redactor.headers(flow.upstream_headers)
        if flow.spool is not None:
            body = flow.spool.finish()
            if isinstance(body, SpilledBody):
                rec.response_body = body  # the writer thread reads it and sets the encoding
            else:
                rec.response_body, rec.response_body_encoding = encode_body(body)
        if flow.pieces is not None and (marks := flow.pieces.final()) is not None:
            rec.extra[PIECE_MS] = marks
        if flow.client_chunks is not None:
            rec.client_body, rec.client_body_encoding = encode_body(b"".join(flow.client_chunks))
        if flow.durable:
            flow.on_disk = asyncio.get_running_loop().create_future()
            self.submit(rec, flow.on_disk)
        else:
            self.submit(rec)

    def error(self, flow: Flow) -> None:
        if flow.rec.error_kind in REFUSED:
            self.refusals.take(flow)
        else:
            self.response_end(flow)
