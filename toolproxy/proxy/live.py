"""What the /_toolproxy/ page shows: per-run counts and recent exchanges, classified as they finish.

The writer thread hands every record it has written to `LiveView.observe`, which only appends it
to a bounded deque. A daemon thread of this module takes them from there and classifies each with
the analyzer's own per-record code (analysis.ingest.analyze_record: the same outcome, sub-kind and
surface `analyze` will store), so the event loop never does this work. Memory is bounded whatever
the traffic: the inbox holds at most INBOX records (older ones are counted as skipped when the
classifier cannot keep up), the recent list is a ring of RECENT exchanges whose bodies are cut at
BODY_CHARS, and the per-run counters are integers.

The classifier also yields the GIL on a duty cycle (it works at most BUSY of every wall-clock
second while records wait) so a burst of traffic never has the proxy competing with it for long.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections import Counter
from typing import Any

from toolproxy.record.model import Record

INBOX = 2_000
RECENT = 300
BODY_CHARS = 64 * 1024
BUSY = 0.25
_FIELDS = tuple(f.name for f in dataclasses.fields(Record))


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status else "none"


def _text(raw: bytes | None, problem: str | None) -> str:
    if problem is not None:
        return f"({problem})"
    if raw is None:
        return ""
    text = raw[: BODY_CHARS * 4].decode("utf-8", "replace")
    return text if len(text) <= BODY_CHARS else text[:BODY_CHARS] + f"\n... ({len(raw):,} bytes in all; `toolproxy show ID` after analyze has the rest)"


def classify_record(rec: Record) -> tuple[dict, dict]:
    """(summary row, detail) of one finished record, by the analyzer's code. Runs off the loop."""
    from analysis.ingest import EXCHANGE_TYPES, analyze_record
    from analysis.reassemble import decode_body, header

    data = {name: getattr(rec, name) for name in _FIELDS}
    analyzed = analyze_record(data, "", 0)
    row = dict(zip(EXCHANGE_TYPES, analyzed.exchange))
    status = rec.client_status if rec.client_status is not None else rec.status
    summary = {
        "id": rec.id, "started_at": rec.started_at, "run": row["run"], "episode": rec.episode, "item": rec.item,
        "condition": rec.condition, "method": rec.method, "path": rec.path, "status": status,
        "duration_ms": rec.duration_ms, "error_kind": rec.error_kind, "model": row["model"],
        "outcome": row["outcome"], "sub_kind": row["sub_kind"], "surface": row["surface"], "n_calls": row["n_calls"],
    }
    if rec.client_body is not None:
        response = _text(*decode_body(rec.client_body, rec.client_body_encoding))
    else:
        response = _text(*decode_body(rec.response_body, rec.response_body_encoding, header(rec.response_headers, "content-encoding")))
    detail = {
        **summary,
        "upstream": rec.upstream, "query": rec.query, "finish_reason": row["finish_reason"],
        "error_message": rec.error_message, "condition_note": rec.condition_note,
        "request_headers": rec.request_headers, "response_headers": rec.response_headers,
        "request_body": _text(*decode_body(rec.request_body, rec.request_body_encoding, header(rec.request_headers, "content-encoding"))),
        "response_body": response,
        "content": (row["content"] or "")[:BODY_CHARS],
        "calls": [{"name": c[2], "arguments": (c[3] or "")[:BODY_CHARS], "surface": c[5], "valid": c[9]} for c in analyzed.calls],
    }
    return summary, detail


def outcome_key(summary: dict) -> str | None:
    """outcome/surface for a turn, non_response/sub-kind for a non-response (as the report splits them)."""
    if not summary["outcome"]:
        return None
    detail = summary["sub_kind"] if summary["outcome"] == "non_response" else summary["surface"]
    return f"{summary['outcome']}/{detail}" if detail else summary["outcome"]


@dataclasses.dataclass
class RunCounts:
    exchanges: int = 0
    first: float = 0.0
    last: float = 0.0
    by_status_class: Counter = dataclasses.field(default_factory=Counter)
    errors: Counter = dataclasses.field(default_factory=Counter)
    outcomes: Counter = dataclasses.field(default_factory=Counter)  # "outcome/surface" or "non_response/sub_kind"
    calls: int = 0
    models: Counter = dataclasses.field(default_factory=Counter)

    def add(self, s: dict) -> None:
        self.exchanges += 1
        self.first = self.first or s["started_at"]
        self.last = max(self.last, s["started_at"])
        self.by_status_class[status_class(s["status"])] += 1
        if s["error_kind"]:
            self.errors[s["error_kind"]] += 1
        if s["outcome"]:
            self.outcomes[outcome_key(s)] += 1
        self.calls += s["n_calls"] or 0
        if s["model"] and len(self.models) < 20:
            self.models[s["model"]] += 1

    def report(self) -> dict:
        return {
            "exchanges": self.exchanges, "first": self.first, "last": self.last, "calls": self.calls,
            "by_status_class": dict(self.by_status_class), "errors": dict(self.errors),
            "outcomes": dict(self.outcomes), "models": dict(self.models),
        }


class LiveView:
    """Classified counts per run and the recent exchanges, fed with written records."""

    def __init__(self, *, inbox: int = INBOX, recent: int = RECENT, max_runs: int = 200) -> None:
        self._inbox: collections.deque[Record] = collections.deque()
        self._inbox_max = inbox
        self._recent: collections.OrderedDict[str, tuple[dict, dict]] = collections.OrderedDict()
        self._recent_max = recent
        self._runs: dict[str, RunCounts] = {}
        self._max_runs = max_runs
        self._lock = threading.Lock()  # guards _recent and _runs between the classifier and readers
        self._wake = threading.Event()
        self._stop = False
        self.observed = 0
        self.classified = 0
        self.skipped = 0  # records the classifier had to let go by (inbox full), or could not classify
        self.failures = 0
        self.last_failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="toolproxy-liveview", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def observe(self, rec: Record) -> None:
        """Called by the writer thread per written record: an append, nothing more."""
        if rec.kind != "exchange":  # the proxy's own fingerprint probes are not traffic
            return
        self.observed += 1
        if len(self._inbox) >= self._inbox_max:
            self._inbox.popleft()
            self.skipped += 1
        self._inbox.append(rec)
        self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(1.0)
            self._wake.clear()
            started = time.monotonic()
            while self._inbox and not self._stop:
                try:
                    rec = self._inbox.popleft()
                except IndexError:
                    break
                self._classify(rec)
                spent = time.monotonic() - started
                if spent > 0.05:  # a slice used: leave the GIL to the proxy for the rest of the cycle
                    time.sleep(spent * (1 - BUSY) / BUSY)
                    started = time.monotonic()

    def _classify(self, rec: Record) -> None:
        try:
            summary, detail = classify_record(rec)
        except Exception as exc:  # noqa: BLE001 - a record the analyzer chokes on must not stop the view
            self.failures += 1
            self.skipped += 1
            self.last_failure = f"{type(exc).__name__}: {exc}"[:300]
            return
        with self._lock:
            runs = self._runs
            counts = runs.get(summary["run"])
            if counts is None:
                if len(runs) >= self._max_runs:
                    del runs[min(runs, key=lambda r: runs[r].last)]  # the run quiet the longest
                counts = runs[summary["run"]] = RunCounts()
            counts.add(summary)
            self._recent[summary["id"]] = (summary, detail)
            if len(self._recent) > self._recent_max:
                self._recent.popitem(last=False)
        self.classified += 1

    def report(self, run: str | None = None, outcome: str | None = None, limit: int = 100) -> dict[str, Any]:
        """Counters per run, and the newest recent exchanges matching the filters (newest first)."""
        with self._lock:
            runs = {name: c.report() for name, c in sorted(self._runs.items(), key=lambda kv: -kv[1].last)}
            recent = []
            for summary, _ in reversed(self._recent.values()):
                if run and summary["run"] != run:
                    continue
                if outcome and outcome not in (summary["outcome"], outcome_key(summary)):
                    continue
                recent.append(summary)
                if len(recent) >= limit:
                    break
        return {
            "observed": self.observed, "classified": self.classified, "pending": len(self._inbox),
            "skipped": self.skipped, "failures": self.failures, "last_failure": self.last_failure,
            "recent_kept": self._recent_max, "runs": runs, "recent": recent,
        }

    def detail(self, exchange_id: str) -> dict | None:
        with self._lock:
            hit = self._recent.get(exchange_id)
        return hit[1] if hit is not None else None
