"""What the /_toolproxy/ page shows: per-run counts and recent exchanges, classified as they finish.

The writer thread hands every record it has written to `LiveView.observe`, which only appends it
to a bounded deque. A feeder thread encodes them (one orjson call each) and sends them in batches
to a classifier *process*, which classifies each with the analyzer's own per-record code
(analysis.ingest.analyze_record: the same outcome, sub-kind and surface `analyze` will store) and
keeps the counters and the recent exchanges. Classifying in a thread of the proxy cost a third of
its throughput under saturation (the GIL); in its own process, at a lower CPU priority, it costs
the proxy an encode per record. The page's requests ask the process for a report off the loop.

Memory is bounded whatever the traffic: the inbox holds at most INBOX records (older ones are
counted as skipped when the classifier cannot keep up), the recent list is a ring of RECENT
exchanges whose bodies are cut at BODY_CHARS, and the per-run counters are integers for at most
MAX_RUNS runs.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import os
import signal
import threading
from collections import Counter
from multiprocessing.connection import Connection, wait
from typing import Any

from toolproxy.proxy.children import start_child
from toolproxy.record.model import Record, encode_record

INBOX = 2_000
RECENT = 300
BODY_CHARS = 64 * 1024
MAX_RUNS = 200
BATCH = 64


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status else "none"


def _text(raw: bytes | None, problem: str | None) -> str:
    if problem is not None:
        return f"({problem})"
    if raw is None:
        return ""
    text = raw[: BODY_CHARS * 4].decode("utf-8", "replace")
    return text if len(text) <= BODY_CHARS else text[:BODY_CHARS] + f"\n... ({len(raw):,} bytes in all; `toolproxy show ID` after analyze has the rest)"


def classify_record(rec: dict) -> tuple[dict, dict]:
    """(summary row, detail) of one finished record (as written), by the analyzer's code."""
    from toolproxy.analysis.bodies import decode_body, header
    from toolproxy.analysis.ingest import EXCHANGE_TYPES, analyze_record

    analyzed = analyze_record(rec, "", 0)
    row = dict(zip(EXCHANGE_TYPES, analyzed.exchange))
    g = rec.get
    status = g("client_status") if g("client_status") is not None else g("status")
    summary = {
        "id": g("id"), "started_at": g("started_at"), "run": row["run"], "episode": g("episode"), "item": g("item"),
        "condition": row["condition"], "method": g("method"), "path": g("path"), "status": status,
        "duration_ms": g("duration_ms"), "error_kind": g("error_kind"), "model": row["model"],
        "outcome": row["outcome"], "sub_kind": row["sub_kind"], "surface": row["surface"], "n_calls": row["n_calls"],
    }
    if g("client_body") is not None:
        response = _text(*decode_body(g("client_body"), g("client_body_encoding")))
    else:
        response = _text(*decode_body(g("response_body"), g("response_body_encoding"), header(g("response_headers"), "content-encoding")))
    detail = {
        **summary,
        "upstream": g("upstream"), "query": g("query"), "finish_reason": row["finish_reason"],
        "error_message": g("error_message"), "condition_note": g("condition_note"),
        "request_headers": g("request_headers") or [], "response_headers": g("response_headers") or [],
        "request_body": _text(*decode_body(g("request_body"), g("request_body_encoding"), header(g("request_headers"), "content-encoding"))),
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


class Tally:
    """The classifier process's state: counters per run and the ring of recent exchanges."""

    def __init__(self, recent: int = RECENT, max_runs: int = MAX_RUNS) -> None:
        self.recent: collections.OrderedDict[str, tuple[dict, dict]] = collections.OrderedDict()
        self.recent_max = recent
        self.runs: dict[str, RunCounts] = {}
        self.max_runs = max_runs
        self.classified = 0
        self.failures = 0
        self.last_failure: str | None = None

    def add(self, line: bytes) -> None:
        import orjson

        try:
            summary, detail = classify_record(orjson.loads(line))
        except Exception as exc:  # noqa: BLE001 - a record the analyzer chokes on must not stop the view
            self.failures += 1
            self.last_failure = f"{type(exc).__name__}: {exc}"[:300]
            return
        runs = self.runs
        counts = runs.get(summary["run"])
        if counts is None:
            if len(runs) >= self.max_runs:
                del runs[min(runs, key=lambda r: runs[r].last)]  # the run quiet the longest
            counts = runs[summary["run"]] = RunCounts()
        counts.add(summary)
        self.recent[summary["id"]] = (summary, detail)
        if len(self.recent) > self.recent_max:
            self.recent.popitem(last=False)
        self.classified += 1

    def report(self, run: str | None, outcome: str | None, limit: int) -> dict[str, Any]:
        runs = {name: c.report() for name, c in sorted(self.runs.items(), key=lambda kv: -kv[1].last)}
        recent = []
        for summary, _ in reversed(self.recent.values()):
            if run and summary["run"] != run:
                continue
            if outcome and outcome not in (summary["outcome"], outcome_key(summary)):
                continue
            recent.append(summary)
            if len(recent) >= limit:
                break
        return {"classified": self.classified, "failures": self.failures, "last_failure": self.last_failure,
                "recent_kept": self.recent_max, "runs": runs, "recent": recent}

    def answer(self, query: tuple) -> Any:
        if query[0] == "report":
            return self.report(*query[1:])
        hit = self.recent.get(query[1])
        return hit[1] if hit is not None else None


def _classifier(records: Connection, queries: Connection, recent: int, max_runs: int) -> None:
    """The classifier process: records in (batches of encoded lines), answers to the page's questions out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the proxy stops us itself
    try:
        os.nice(10)  # the proxy's requests come first when the machine is busy
    except OSError:
        pass
    tally = Tally(recent, max_runs)
    while True:
        for conn in wait([records, queries]):
            try:
                msg = conn.recv()
            except EOFError:
                return
            if conn is queries:
                queries.send(tally.answer(msg))
            elif msg is None:
                return
            else:
                for line in msg:
                    tally.add(line)


class LiveView:
    """The proxy's side: takes written records, feeds the classifier process, asks it for reports."""

    def __init__(self, *, inbox: int = INBOX, recent: int = RECENT, max_runs: int = MAX_RUNS) -> None:
        self._inbox: collections.deque[Record] = collections.deque()
        self._inbox_max = inbox
        self._recent, self._max_runs = recent, max_runs
        self._wake = threading.Event()
        self._stop = False
        self._ask = threading.Lock()  # one question at a time on the query pipe
        self.observed = 0
        self.sent = 0
        self.skipped = 0  # records let go unclassified: the inbox was full, or unencodable
        self.broken: str | None = None
        self._proc = None
        self._records = self._queries = None
        self._feeder = threading.Thread(target=self._feed, name="toolproxy-liveview", daemon=True)

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        rec_out, rec_in = ctx.Pipe(duplex=False)
        self._queries, child_queries = ctx.Pipe()
        self._records = rec_in
        self._proc = ctx.Process(target=_classifier, args=(rec_out, child_queries, self._recent, self._max_runs),
                                 name="toolproxy-classifier", daemon=True)
        start_child(self._proc)
        rec_out.close()
        child_queries.close()
        self._feeder.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop = True
        self._wake.set()
        if self._feeder.is_alive():
            self._feeder.join(timeout)
        if self._proc is not None:
            try:
                self._records.send(None)
            except (OSError, ValueError):
                pass
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(timeout)

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

    def _feed(self) -> None:
        while not self._stop:
            self._wake.wait(1.0)
            self._wake.clear()
            while self._inbox and not self._stop:
                batch = []
                while self._inbox and len(batch) < BATCH:
                    rec = self._inbox.popleft()
                    try:
                        batch.append(encode_record(rec))
                    except Exception:  # noqa: BLE001 - the writer dropped it too; the view skips it
                        self.skipped += 1
                try:
                    self._records.send(batch)  # blocks while the classifier is behind: the inbox then bounds memory
                except (OSError, ValueError) as exc:
                    self.broken = f"the classifier process stopped: {exc}"
                    return
                self.sent += len(batch)

    def _question(self, query: tuple) -> Any:
        if self.broken or self._proc is None or not self._proc.is_alive():
            self.broken = self.broken or "the classifier process is not running"
            return None
        with self._ask:
            self._queries.send(query)
            if not self._queries.poll(10.0):
                return None
            return self._queries.recv()

    def report(self, run: str | None = None, outcome: str | None = None, limit: int = 100) -> dict[str, Any]:
        """Counters per run and the newest recent exchanges matching the filters. Blocks: call it off the loop."""
        rep = self._question(("report", run, outcome, limit)) or {
            "classified": 0, "failures": 0, "last_failure": None, "recent_kept": self._recent, "runs": {}, "recent": []}
        return {**rep, "observed": self.observed, "pending": len(self._inbox) + self.sent - rep["classified"] - rep["failures"],
                "skipped": self.skipped, "broken": self.broken}

    def detail(self, exchange_id: str) -> dict | None:
        """One recent exchange's request and response. Blocks: call it off the loop."""
        return self._question(("detail", exchange_id))
