"""A recorded run as playback needs it: each exchange's request and the reply its client got.

Read straight from the segments (no `analyze` needed), so a data directory copied into a test
tree is a fixture as it is, and read through the record reader analyze uses
(`toolproxy.record.schema`): a line analyze sets aside (not JSON, no id, a field of the wrong
type) is set aside here too, counted and never served. So is an exchange of the run that cannot
be sent as recorded (`UNPLAYABLE`: a status outside 200-599, a header that is not one on the
wire, a body that does not decode, piece marks that are not marks), since playing it would
mean sending something no server sends, or failing mid-reply.

The reply is what the harness saw, not always what the upstream sent: under a condition that
rewrote it (`text`, `constrained`...) the client's body is the one recorded in `client_body`, and
an exchange the proxy answered itself (upstream unreachable, body too large) has only the proxy's
own status and error body.
"""

from __future__ import annotations

import binascii
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolproxy.record.model import CLIENT_CLOSED, MCP, USER_INTERRUPT, body_bytes
from toolproxy.record.pacing import EXTRA_KEY as PIECE_MS
from toolproxy.record.pacing import read_marks
from toolproxy.record.schema import EXCHANGE, Issue, read_checked
from toolproxy.record.segments import list_segments

# Errors after which the client got the recorded bytes and then a closed connection.
CUT_SHORT = frozenset(
    {"upstream_closed", "timeout", "response_too_large", CLIENT_CLOSED, USER_INTERRUPT, "proxy_error"}
)
UNPLAYABLE = "unplayable"
# A header as HTTP has them (RFC 9110 5.1, 5.5): a token for a name; a value of visible
# characters, spaces and tabs (no CR or LF, which would start a header of the recording's choosing).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")


class FixtureError(Exception):
    """The run cannot be played back (no such run, no data directory); the message says why."""


class Unplayable(ValueError):
    """A recorded exchange playback cannot send as recorded; the message says what is wrong."""


# Every reply a playback server sends carries the id of the recorded exchange that answered it (or
# `miss`): a harness's run recorded against a playback is known by it as a played run, whose
# provenance is the recording's (analysis.report.provenance).
REPLY_HEADER = "X-Toolproxy-Playback"


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
    # How long the exchange took: no recorded wait in it (ttfb, piece marks) is played longer.
    duration_ms: float | None
    # [(end offset, ms since the exchange started), ...] for a body that came in pieces.
    pieces: list[tuple[int, float]] = field(default_factory=list)
    # The MCP server this exchange was with (an MCP record), or None for a model's.
    mcp_server: str | None = None


@dataclass
class Fixture:
    """The run's playable exchanges, and every line set aside on the way (of any run when the
    line could not be read, of this run when its exchange could not be played)."""

    exchanges: list[RecordedExchange]
    set_aside: list[Issue] = field(default_factory=list)
    # The run's MCP servers by name, each with its transport (stdio, http); stdio ones are played
    # by `toolproxy mcp --playback` from `stdio` (their requests and responses, by server).
    mcp_servers: dict[str, str] = field(default_factory=dict)
    stdio: dict[str, list[RecordedExchange]] = field(default_factory=dict)

    def set_aside_counts(self) -> dict[str, int]:
        return dict(Counter(issue.kind for issue in self.set_aside))

    def set_aside_line(self) -> str:
        """`set aside 3 lines (bad_type 2, unplayable 1)`, or "" when none was."""
        n = len(self.set_aside)
        if not n:
            return ""
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.set_aside_counts().items()))
        return f"set aside {n} line{'s' if n != 1 else ''} ({kinds})"


def load_fixture(data_dir: str | Path, run: str) -> Fixture:
    """Every playable exchange of `run` with a reply, in recorded order; FixtureError when there is none."""
    data_dir = Path(data_dir)
    if not list_segments(data_dir):
        raise FixtureError(f"no recordings in {data_dir} (no segments under {data_dir / 'segments'})")
    found: list[RecordedExchange] = []
    stdio: dict[str, list[RecordedExchange]] = {}
    servers: dict[str, str] = {}
    set_aside: list[Issue] = []
    runs: set[str] = set()
    for line in read_checked(data_dir):
        rec = line.record
        if rec is None:
            set_aside.append(line.issue)
            continue
        kind = rec.get("kind", EXCHANGE)
        if kind not in (EXCHANGE, MCP):
            continue
        runs.add(str(rec.get("run")))
        if rec.get("run") != run:
            continue
        server = mcp_server(rec) if kind == MCP else None
        if kind == MCP and server is None:
            continue
        try:
            if kind == MCP and rec["mcp"].get("transport") != "http":
                transport = "stdio"
                exchange = stdio_exchange(rec, sum(map(len, stdio.values())))
                if exchange is not None:
                    stdio.setdefault(server, []).append(exchange)
            else:
                transport = "http"
                exchange = to_exchange(rec, len(found), server)
                if exchange is not None:
                    found.append(exchange)
        except Unplayable as exc:
            set_aside.append(
                Issue(line.segment, line.offset, UNPLAYABLE, f"record {rec['id']}: {exc}; not played", rec["id"])
            )
            continue
        if server is not None:
            servers[server] = transport
    if not found and not stdio:
        known = ", ".join(sorted(runs)[:20]) or "none"
        unplayable = [issue for issue in set_aside if issue.kind == UNPLAYABLE]
        why = (
            f"; {len(unplayable)} of its exchanges cannot be played, the first: {unplayable[0].line()}"
            if unplayable
            else ""
        )
        raise FixtureError(f"run {run!r} has no recorded exchanges in {data_dir} (runs there: {known}){why}")
    return Fixture(found, set_aside, servers, stdio)


def mcp_server(rec: dict[str, Any]) -> str | None:
    """The name of the MCP server an MCP record is of, or None when it names none."""
    mcp = rec.get("mcp")
    server = mcp.get("server") if isinstance(mcp, dict) else None
    return server if isinstance(server, str) and server else None


def stdio_exchange(rec: dict[str, Any], order: int) -> RecordedExchange | None:
    """A stdio MCP record as playback answers it: a client's request with its response, keyed by
    the request's method (in `path`); None for any other stdio record (lone messages, the
    server's own requests, lifecycle events, requests never answered)."""
    mcp = rec["mcp"]
    if mcp.get("event", "message") != "message" or mcp.get("from") != "client" or mcp.get("message") != "request":
        return None
    if rec.get("response_body") is None or not isinstance(mcp.get("method"), str):
        return None
    tags = rec.get("tags") if isinstance(rec.get("tags"), dict) else {}
    return RecordedExchange(
        id=rec["id"],
        order=order,
        method="MCP",
        path=mcp["method"],
        query="",
        episode=rec.get("episode"),
        item=rec.get("item"),
        tags={str(k): str(v) for k, v in tags.items()},
        request_body=_body(rec.get("request_body"), rec.get("request_body_encoding"), "request"),
        status=200,
        headers=[],
        body=_body(rec.get("response_body"), rec.get("response_body_encoding"), "response"),
        cut=False,
        ttfb_ms=rec.get("ttfb_ms"),
        duration_ms=rec.get("duration_ms"),
        mcp_server=mcp_server(rec),
    )


def to_exchange(rec: dict[str, Any], order: int, server: str | None = None) -> RecordedExchange | None:
    """The exchange a checked record holds, or None when its client got no status at all (it
    hung up before the reply started: there is nothing to play back). Unplayable when what the
    client got cannot be sent again as it was recorded."""
    client_body = rec.get("client_body")
    if client_body is not None:
        status = rec.get("client_status") if rec.get("client_status") is not None else rec.get("status")
        body = _body(client_body, rec.get("client_body_encoding"), "client")
        pieces: list = []  # the marks are the upstream's pieces, not the rewritten body's
    else:
        status = rec.get("status")
        body = _body(rec.get("response_body"), rec.get("response_body_encoding"), "response")
        extra = rec.get("extra")
        marks = extra.get(PIECE_MS) if isinstance(extra, dict) else None
        try:
            pieces = read_marks(marks) if marks is not None else []
        except ValueError as exc:
            raise Unplayable(str(exc)) from None
    if status is None:
        return None
    if not 200 <= status <= 599:  # a 1xx is an interim answer: no reply ends with one
        raise Unplayable(f"status {status} is not the status of an HTTP reply (200-599)")
    if status in (204, 304) and body:
        raise Unplayable(f"a {status} reply has no body, and this one has {len(body)} bytes")
    if client_body is not None and rec.get("status") is None:
        headers = [("Content-Type", "application/json")]
    else:
        headers = _headers(rec.get("response_headers"))
        if client_body is not None:
            # The client's body is not the upstream's: its length and encoding are not either.
            headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "content-encoding")]
    if not _VALUE.fullmatch(rec["id"]):
        raise Unplayable("its id cannot be sent in a header")
    tags = rec.get("tags") if isinstance(rec.get("tags"), dict) else {}
    return RecordedExchange(
        id=rec["id"],
        order=order,
        method=rec.get("method") or "POST",
        path=rec.get("path") or "/",
        query=rec.get("query") or "",
        episode=rec.get("episode"),
        item=rec.get("item"),
        tags={str(k): str(v) for k, v in tags.items()},
        request_body=_body(rec.get("request_body"), rec.get("request_body_encoding"), "request"),
        status=status,
        headers=headers,
        body=body,
        cut=not rec.get("response_complete") and rec.get("error_kind") in CUT_SHORT and rec.get("status") is not None,
        ttfb_ms=rec.get("ttfb_ms"),
        duration_ms=rec.get("duration_ms"),
        pieces=pieces,
        mcp_server=server,
    )


def _body(text: str | None, encoding: str | None, which: str) -> bytes:
    try:
        return body_bytes(text, encoding) or b""
    except (binascii.Error, ValueError) as exc:
        raise Unplayable(f"the {which} body is not valid {encoding}: {exc}") from None


def _headers(value: Any) -> list[tuple[str, str]]:
    """Recorded response headers as they can be sent: [name, value] pairs, each a header HTTP has."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Unplayable(f"its response headers are {type(value).__name__}, not a list of [name, value] pairs")
    out = []
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], str)):
            raise Unplayable("its response headers are not all [name, value] pairs of strings")
        name, text = pair
        if not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(text):
            raise Unplayable(
                f"its response header {name[:40]!r} is not one HTTP can carry (a control character, or a name that is "
                "no token)"
            )
        out.append((name, text))
    lengths = [v for k, v in out if k.lower() == "content-length"]
    if len(lengths) > 1 or (lengths and not (lengths[0].strip().isascii() and lengths[0].strip().isdigit())):
        raise Unplayable(f"its Content-Length {', '.join(lengths)[:40]!r} is not one length")
    return out
