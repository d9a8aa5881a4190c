"""What a request must pass, after the other addons' request_headers hooks, before its body is read.

Kept out of the handler so that each is a unit of its own, tested with a built flow: only
origin-form targets are forwarded (toolproxy is never an open proxy; playback asks the same
function), the upstream key replaces whatever Authorization the client sent, and new work waits
while the writer catches up.
"""

from __future__ import annotations

import time

from toolproxy.proxy.flow import Addon, Flow, Refusal
from toolproxy.record.writer import SegmentWriter

NOT_A_FORWARD_PROXY = "not_a_forward_proxy"


def origin_form_refusal(path: str, destination: str) -> Refusal | None:
    """The refusal of a request whose target is not a path, or None when it is one.

    An absolute-form target (`GET http://elsewhere/ HTTP/1.1`) or an authority-form one (`CONNECT
    host:port`, or `CONNECT 2`, which joined to the upstream's URL named another port of its host)
    asks a forward proxy to go elsewhere; toolproxy goes only to `destination`. `path` is the
    target with its tag prefix taken off, as it would be appended to the upstream's URL.
    """
    if path.startswith("/"):
        return None
    return Refusal(
        400,
        NOT_A_FORWARD_PROXY,
        f"absolute-form request targets are refused: toolproxy forwards only to {destination}; "
        "send requests to its own address instead",
        NOT_A_FORWARD_PROXY,
    )


class OriginFormOnly(Addon):
    """Refuses a target that is not a path (origin_form_refusal)."""

    def __init__(self, upstream: str) -> None:
        self.destination = f"its configured upstream ({upstream})"

    def request_headers(self, flow: Flow) -> None:
        refused = origin_form_refusal(flow.up_path, self.destination)
        if refused is not None:
            raise refused


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
