"""A recorded run as playback needs it: each exchange's request and the reply its client got.

Read straight from the segments (no `analyze` needed), so a data directory copied into a test
tree is a fixture as it is. The reply is what the harness saw, not always what the upstream
sent: under a condition that rewrote it (`text`, `constrained`...) the client's body is the one
recorded in `client_body`, and an exchange the proxy answered itself (upstream unreachable,
body too large) has only the proxy's own status and error body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolproxy.record.model import body_bytes
from toolproxy.record.pacing import EXTRA_KEY as PIECE_MS
from toolproxy.record.segments import list_segments, read_segment

# Errors after which the client got the recorded bytes and then a closed connection.
CUT_SHORT = frozenset({"upstream_closed", "timeout", "response_too_large", "client_closed", "proxy_error"})


class FixtureError(Exception):
    """The run cannot be played back (no such run, no data directory); the message says why."""


@dataclass(frozen=True, slots=True)
class RecordedExchange:
    id: str
    order: int  # position in the run as recorded (segment order, then line order)
    method: str
    path: str
    query: str
    episode: str | None
    item: str | None
    tags: dict[str, str]
    request_body: bytes
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    # The client got the body and then a closed connection (the recorded exchange was cut short).
    cut: bool
    ttfb_ms: float | None
    # [[end offset, ms since the exchange started], ...] for a body that came in pieces.
    pieces: list[list[float]] = field(default_factory=list)


def load_fixture(data_dir: str | Path, run: str) -> list[RecordedExchange]:
    """Every exchange of `run` with a reply, in recorded order; FixtureError when there is none."""
    data_dir = Path(data_dir)
    segments = list_segments(data_dir)
    if not segments:
        raise FixtureError(f"no recordings in {data_dir} (no segments under {data_dir / 'segments'})")
    found: list[RecordedExchange] = []
    runs: set[str] = set()
    for seg in segments:
        for line in read_segment(seg):
            rec = line.record
            if rec is None or rec.get("kind", "exchange") != "exchange":
                continue
            runs.add(str(rec.get("run")))
            if rec.get("run") == run:
                exchange = to_exchange(rec, len(found))
                if exchange is not None:
                    found.append(exchange)
    if not found:
        known = ", ".join(sorted(runs)[:20]) or "none"
        raise FixtureError(f"run {run!r} has no recorded exchanges in {data_dir} (runs there: {known})")
    return found


def to_exchange(rec: dict[str, Any], order: int) -> RecordedExchange | None:
    """The exchange a record holds, or None when its client got no status at all (it hung up
    before the reply started: there is nothing to play back)."""
    client_body = rec.get("client_body")
    if client_body is not None:
        status = rec.get("client_status") or rec.get("status")
        body = body_bytes(client_body, rec.get("client_body_encoding")) or b""
        pieces: list = []  # the marks are the upstream's pieces, not the rewritten body's
    else:
        status = rec.get("status")
        body = body_bytes(rec.get("response_body"), rec.get("response_body_encoding")) or b""
        pieces = list((rec.get("extra") or {}).get(PIECE_MS) or [])
    if not isinstance(status, int):
        return None
    headers = [(str(k), str(v)) for k, v in rec.get("response_headers") or [] if isinstance(v, str)]
    if client_body is not None:
        # The client's body is not the upstream's: its length and encoding are not either.
        headers = (
            [(k, v) for k, v in headers if k.lower() not in ("content-length", "content-encoding")]
            if rec.get("status") is not None
            else [("Content-Type", "application/json")]
        )
    tags = rec.get("tags") if isinstance(rec.get("tags"), dict) else {}
    return RecordedExchange(
        id=str(rec.get("id")),
        order=order,
        method=str(rec.get("method") or "POST"),
        path=str(rec.get("path") or "/"),
        query=str(rec.get("query") or ""),
        episode=_text(rec.get("episode")),
        item=_text(rec.get("item")),
        tags={str(k): str(v) for k, v in tags.items()},
        request_body=body_bytes(rec.get("request_body"), rec.get("request_body_encoding")) or b"",
        status=status,
        headers=headers,
        body=body,
        cut=not rec.get("response_complete") and rec.get("error_kind") in CUT_SHORT and rec.get("status") is not None,
        ttfb_ms=rec.get("ttfb_ms") if isinstance(rec.get("ttfb_ms"), (int, float)) else None,
        pieces=pieces,
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
