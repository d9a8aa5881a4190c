"""Faults a test injects into an emulator: stalls, cuts, raw bodies, gzip, repeated failures, and a
stack that loses tool calls only when it streams."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Fault:
    """A disturbance for the next `times` matching requests (None: every request).

    status/body replace the whole answer (raw bytes, sent as given: non-UTF-8, non-JSON...);
    close_after drops the connection after that many stream events (or body bytes when not
    streaming); stall_before delays the status line; stall_between delays every event; gzip
    compresses the body with Content-Encoding: gzip; headers are added to the answer (repeats kept);
    drop_streamed_calls makes a streamed answer carry the model's text but none of its calls;
    pings sends a stream's status line at once, then a `:` comment line every ping_every seconds for
    that many seconds before the first event (llama-server's keep-alive while it processes a long
    prompt, b9478 and later: its first byte is no token).
    """

    times: int | None = 1
    path: str | None = None
    method: str | None = None  # only requests of this method (None: any)
    status: int | None = None
    body: bytes | None = None
    content_type: str = "application/json"
    stall_before: float = 0.0
    stall_between: float = 0.0
    close_after: int | None = None
    gzip: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    drop_streamed_calls: bool = False
    pings: float = 0.0
    ping_every: float = 1.0


def stall(before: float = 0.0, between: float = 0.0, times: int | None = 1, path: str | None = None) -> Fault:
    return Fault(times=times, path=path, stall_before=before, stall_between=between)


def close_mid_stream(after: int = 2, times: int | None = 1, path: str | None = None) -> Fault:
    return Fault(times=times, path=path, close_after=after)


def raw(
    body: bytes,
    status: int = 200,
    content_type: str = "application/json",
    times: int | None = 1,
    path: str | None = None,
) -> Fault:
    return Fault(times=times, path=path, status=status, body=body, content_type=content_type)


def keepalive(seconds: float, every: float = 1.0, times: int | None = 1, path: str | None = None) -> Fault:
    """A stream whose first event comes after `seconds` of keep-alive comments (see Fault.pings):
    only a POST gets it (a stream answers one)."""
    return Fault(times=times, path=path, method="POST", pings=seconds, ping_every=every)


def gzipped(times: int | None = 1, path: str | None = None) -> Fault:
    return Fault(times=times, path=path, gzip=True)


def drops_streamed_calls(times: int | None = None, path: str | None = None) -> Fault:
    """A stack whose streaming path loses the calls its non-streaming path returns: the same
    request answers with `tool_calls` when `stream` is false and with none (finish_reason `stop`)
    when it is true. A recurring class of serving bugs: mlx-serve never emitted streamed tool
    calls (ddalcu/mlx-serve#287), vLLM's hermes parser streamed a call's name without its
    arguments (vllm-project/vllm#11392). `toolproxy replay --stream off` is how such a stack is
    caught from a streamed recording."""
    return Fault(times=times, path=path, drop_streamed_calls=True)
