"""Requests refused before anything is forwarded: every one counted, a bounded share recorded.

A refusal answers a request without the upstream because of who sent it or of the proxy's own
state: no token (401 `unauthorized`), an absolute-form target (400 `not_a_forward_proxy`), a
request aiohttp's HTTP parser rejected (400 `parser_rejected`), the disk budget reached under
`--on-disk-full block` (503 `disk_budget_full`), recording failing under `--on-record-failure
block` (503 `recording_failed`). Anyone who reaches the port can send these as fast as it likes,
each with up to a megabyte of headers: recorded like exchanges they would let a client without
the token fill the disk and, under `--max-disk`, get the real recordings pruned away. So, as a
web server treats failed logins and bad requests (count all, log within limits, rotate):

- Every refusal is counted by kind (`refused.by_kind` in `/_toolproxy/stats`): a plain increment.
- At most RECORDS refusals, and BYTES of them, are recorded per INTERVAL seconds (the first of
  each interval; the rest are counted in `not_recorded`). A recorded one keeps at most
  HEADER_CHARS of headers in all (secrets redacted before anything is cut), TEXT_CHARS of each
  text field a client chose (path, query, run and the other tags), MAX_TAGS tags; each field cut
  is named with its original size in `extra.truncated`. A refused request's body is never read,
  so never recorded.
- They go to segments of their own (`<...>.refused.jsonl`) of at most SEGMENT_MAX bytes, of which
  the newest KEEP closed ones stay: the oldest are pruned (through the prune ledger) as a new one
  opens. A `--max-disk` budget does not count them, so they can neither get an exchange's record
  pruned nor make the proxy refuse. `recording_failed` refusals are the exception: they go to the
  exchanges' own writer, being the probe whose first successful write ends the failure.
- Under `--durability sync` a refusal that is recorded is on disk before its answer leaves, as
  every answer is; one over the budget is answered at once, being only counted.

Under `--workers N` each worker has these limits of its own.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from toolproxy.proxy.flow import Flow
from toolproxy.proxy.headers import Redactor, is_secret_header
from toolproxy.record.model import Record, new_id, now
from toolproxy.record.retention import prune
from toolproxy.record.writer import SegmentWriter

UNAUTHORIZED = "unauthorized"
PARSER_REJECTED = "parser_rejected"
RECORDING_FAILED = "recording_failed"
ADMIN_UNAUTHORIZED = "admin_unauthorized"  # counted, never recorded: admin routes never are
REFUSED = frozenset(
    {
        UNAUTHORIZED,
        "host_refused",
        "origin_refused",
        "not_a_forward_proxy",
        PARSER_REJECTED,
        "disk_budget_full",
        RECORDING_FAILED,
    }
)

INTERVAL = 10.0
RECORDS = 100
BYTES = 256 * 1024
HEADER_CHARS = 2048
TEXT_CHARS = 256
MAX_TAGS = 8
SEGMENT_MAX = 1024 * 1024
KEEP = 4
# What a record takes beyond the fields counted here (its id, times, field names, the proxy's answer).
OVERHEAD = 1024

_TEXTS = ("client_path", "path", "query", "run", "episode", "item", "condition")


def bounded_headers(
    raw: Iterable[tuple[bytes, bytes]], redactor: Redactor, limit: int = HEADER_CHARS
) -> tuple[list[list[str]], int | None]:
    """Request headers as a record stores them (wire bytes as ISO-8859-1, secret values replaced
    by the redactor's stand-ins), in order while names and values total at most `limit` characters; the first that
    does not fit is cut to the room left and the rest are left out. Returns the headers and, when
    anything was cut, the characters all of them took."""
    out: list[list[str]] = []
    used = total = 0
    cut = False
    for k, v in raw:
        total += len(k) + len(v)
        if used >= limit:
            cut = True
            continue
        name = k.decode("latin-1")
        # Redacted before it is cut: a hash of a secret's first characters could be guessed.
        value = redactor.value(v) if is_secret_header(name) else v.decode("latin-1")
        room = limit - used
        if len(name) + len(value) > room:
            name, value = name[:room], value[: max(0, room - len(name))]
            cut = True
        out.append([name, value])
        used += len(name) + len(value)
    return out, (total if cut else None)


def bound_fields(rec: Record) -> dict[str, int]:
    """Cut the text fields and tags a client chose to their bounds, in place; {field: its
    original size} for each one cut (tags: their number, or `tags.<name>`: its value's length)."""
    cut: dict[str, int] = {}
    for name in _TEXTS:
        value = getattr(rec, name)
        if isinstance(value, str) and len(value) > TEXT_CHARS:
            cut[name] = len(value)
            setattr(rec, name, value[:TEXT_CHARS])
    if len(rec.tags) > MAX_TAGS:
        cut["tags"] = len(rec.tags)
    tags = {}
    for key, value in list(rec.tags.items())[:MAX_TAGS]:
        if len(key) > TEXT_CHARS or len(value) > TEXT_CHARS:
            cut[f"tags.{key[:TEXT_CHARS]}"] = len(value)
        tags[key[:TEXT_CHARS]] = value[:TEXT_CHARS]
    rec.tags = tags
    return cut


def _chars(rec: Record) -> int:
    """About the characters a bounded refusal's record takes (for the bytes budget)."""
    texts = sum(len(getattr(rec, name) or "") for name in _TEXTS)
    tags = sum(len(k) + len(v) for k, v in rec.tags.items())
    headers = sum(len(k) + len(v) for k, v in rec.request_headers)
    return OVERHEAD + texts + tags + headers + len(rec.client_body or "") + len(rec.error_message or "")


class RefusalBudget:
    """The counts of refused requests and the budget their records are kept within (module doc)."""

    def __init__(
        self,
        writer: SegmentWriter,
        exchanges: SegmentWriter,
        upstream: str,
        default_run: Callable[[float], str | None],
        redactor: Redactor,
    ) -> None:
        self.writer = writer  # the refusals' own segments
        self.exchanges = exchanges  # the exchanges' writer (recording_failed refusals)
        self.upstream = upstream
        self.default_run = default_run
        self.redactor = redactor
        self.by_kind: dict[str, int] = {}
        self.recorded = 0
        self.not_recorded = 0
        self.truncated = 0
        self._interval = -1
        self._records = 0
        self._bytes = 0

    def count(self, kind: str) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def take(self, flow: Flow) -> None:
        """A refused exchange has ended (its answer is built): count it, record it if the budget allows."""
        rec = flow.rec
        self.count(rec.error_kind)
        if not self._room():
            return
        rec.ended_at = now()
        rec.duration_ms = flow.elapsed_ms()
        rec.request_headers, headers = bounded_headers(flow.request.raw_headers, self.redactor)
        cut = bound_fields(rec)
        if headers is not None:
            cut["request_headers"] = headers
        flow.on_disk = self._record(rec, cut, flow.durable)

    def parser_rejected(self, status: int, exc: BaseException) -> None:
        """aiohttp's parser rejected a request: no handler ran. Counted; recorded (budget allowing)
        with nothing of what was sent, only the parser's verdict by name, since its message
        quotes the request's bytes (headers, query strings: keys)."""
        self.count(PARSER_REJECTED)
        if not self._room():
            return
        started = now()
        rec = Record(id=new_id(), started_at=started, upstream=self.upstream, run=self.default_run(started))
        rec.set_error(
            PARSER_REJECTED, f"the HTTP parser rejected the request ({type(exc).__name__}); nothing of it is recorded"
        )
        rec.client_status = status
        rec.ended_at = now()
        rec.duration_ms = 0.0
        self._record(rec, {}, False)

    def _room(self) -> bool:
        """Whether this interval still takes a record; counts the refusal as not recorded if not."""
        interval = int(time.monotonic() // INTERVAL)
        if interval != self._interval:
            self._interval, self._records, self._bytes = interval, 0, 0
        if self._records >= RECORDS:
            self.not_recorded += 1
            return False
        return True

    def _record(self, rec: Record, cut: dict[str, int], durable: bool) -> asyncio.Future | None:
        """Submit a bounded refusal if the interval's bytes allow; the waiter for its fsync when
        `durable` (sync mode) and it was submitted."""
        size = _chars(rec)
        if self._bytes + size > BYTES:
            self.not_recorded += 1
            return None
        self._records += 1
        self._bytes += size
        if cut:
            rec.extra["truncated"] = cut
            self.truncated += 1
        self.recorded += 1
        waiter = asyncio.get_running_loop().create_future() if durable else None
        (self.exchanges if rec.error_kind == RECORDING_FAILED else self.writer).submit(rec, waiter)
        return waiter

    def report(self) -> dict:
        w = self.writer.stats
        return {
            "by_kind": dict(self.by_kind),
            "recorded": self.recorded,
            "not_recorded": self.not_recorded,
            "truncated": self.truncated,
            "written": w.written,
            "dropped": w.dropped,
        }


def segment_bytes(exchanges_segment_bytes: int) -> int:
    """The refusals' segment size: a segment rotates (and the oldest go) at least this often."""
    return min(SEGMENT_MAX, exchanges_segment_bytes)


def rotation(data_dir: str | Path, seg_bytes: int) -> Callable[[], None]:
    """The refusals' writer's hook before each new segment: keep the newest KEEP closed ones."""

    def make_room() -> None:
        try:
            prune(data_dir, max_bytes=KEEP * seg_bytes, refusals=True)
        except OSError as exc:  # the next rotation tries again; the records are still written
            print(
                f"toolproxy: cannot prune refused requests' segments in {data_dir}: {exc}", file=sys.stderr, flush=True
            )

    return make_room
