"""What a request must pass, after the other addons' request_headers hooks, before its body is read.

Kept out of the handler so that each is a unit of its own, tested with a built flow: only
origin-form targets are forwarded (toolproxy is never an open proxy), the upstream key replaces
whatever Authorization the client sent, and new work waits while the writer catches up.
"""

from __future__ import annotations

import time

from toolproxy.proxy.flow import Addon, Flow
from toolproxy.record.writer import SegmentWriter


class OriginFormOnly(Addon):
    """Refuses an absolute-form target (`GET http://elsewhere/ HTTP/1.1`): the request would ask
    a forward proxy to go elsewhere, and this one goes only to its configured upstream."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    def request_headers(self, flow: Flow) -> None:
        if not flow.up_path.startswith("/"):
            flow.refuse(
                400,
                "not_a_forward_proxy",
                "absolute-form request targets are refused: toolproxy forwards only to its configured upstream "
                f"({self.upstream}); send requests to its own address instead",
                "not_a_forward_proxy",
            )


class UpstreamKey(Addon):
    """`--upstream-key`: the upstream sees this key, never the client's own Authorization."""

    def __init__(self, key: str) -> None:
        self.value = f"Bearer {key}"

    def request_headers(self, flow: Flow) -> None:
        headers = flow.up_headers
        for k in [k for k in headers if k.lower() == "authorization"]:
            del headers[k]
        headers["Authorization"] = self.value


async def writer_backpressure(flow: Flow, writer: SegmentWriter) -> None:
    """New work waits while the writer is behind (the handler calls this only then), so the
    queue of records cannot grow without bound; the record says how long it waited."""
    waited = time.perf_counter()
    await writer.caught_up()
    flow.rec.extra["recording_wait_ms"] = round((time.perf_counter() - waited) * 1000.0, 3)
