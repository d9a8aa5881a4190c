"""What the /_toolproxy/ page shows: per-run counts and recent exchanges, classified as they finish.

The writer thread hands every record it has written to `LiveView.observe`, with the JSON line it
already encoded when it has one; observe only appends that line (or the record, when there is
none) to a bounded deque. A feeder thread wakes every FEED_EVERY, encodes what came without a
line, and sends what arrived in messages of at most HANDOFF records to a classifier *process*,
which classifies each record with the analyzer's own per-record code
(analysis.ingest.records.analyze_record: the same outcome, sub-kind and surface `analyze` will store) and
keeps the counters, the recent exchanges and each run's attempts, from which it derives turns,
episodes and roles as the report does when the page asks (toolproxy.proxy.liveturns). Classifying
costs about as much CPU as forwarding, so it cannot share the proxy's interpreter (the GIL), and
the classifier process runs only on CPU time nothing else wants. The page's requests ask it for a report off the loop.

The proxy never waits for the classifier. When it falls behind, the inbox lets its oldest records
go unclassified: they are still counted (run, status class, error), as `unclassified` with the
reason, so the page's exchange counts stay those of the proxy and it says how many turns it could
not classify. Bodies spilled to disk (too large to hold in memory) are counted the same way.

Memory is bounded whatever the traffic: the inbox holds at most INBOX records and INBOX_BYTES of
them (a count alone let a flood of long contexts hold hundreds of megabytes, and even short ones,
held while the classifier is starved, spread over the proxy's heap), the recent list is
a ring of RECENT exchanges whose bodies are cut at BODY_CHARS, the per-run counters are
integers for at most MAX_RUNS runs, and the attempts kept for the turns are bounded per run and in
all (liveturns).

Under `serve --workers N` every worker has its own classifier, which also answers on a Unix
socket in the group's private directory, so whichever worker serves the page merges its peers'
counts and recent exchanges with its own (`merge_reports`), and finds an exchange a peer holds.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import orjson

from toolproxy.proxy.children import sigint_ignored
from toolproxy.record.model import Record, encode_record, stored_text

if TYPE_CHECKING:  # the analyzer's modules load in the classifier process only
    from toolproxy.proxy.liveturns import Held

INBOX = 1_000
INBOX_BYTES = 1 << 20
RECENT = 300
BODY_CHARS = 64 * 1024
MAX_RUNS = 200
FEED_EVERY = 0.05  # seconds between the feeder's hand-offs
HANDOFF = 256  # records per message to the classifier at most
SLICE = 32  # records the classifier classifies between looks for a question from the page
ASK_TIMEOUT = 5.0
UNTAGGED_RUN = "(untagged)"  # as the analyzer names it
OTHER_RUNS = "(other runs)"

# Why an exchange was counted without being classified.
BEHIND = "behind"  # the classifier could not keep up
LARGE = "large"  # a body was spilled to disk while it passed: too large to classify in memory
UNENCODABLE = "unencodable"
_WHY = {BEHIND: "the classifier is behind", LARGE: "a body too large to hold in memory",
        UNENCODABLE: "the record could not be encoded again"}


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status else "none"


def _text(raw: bytes | None, problem: str | None) -> str:
    if problem is not None:
        return f"({problem})"
    if raw is None:
        return ""
    text = raw[: BODY_CHARS * 4].decode("utf-8", "replace")
    return text if len(text) <= BODY_CHARS else text[:BODY_CHARS] + f"\n... ({len(raw):,} bytes in all; `toolproxy show ID` after analyze has the rest)"


def classify_record(rec: dict) -> tuple[dict, dict, Held | None]:
    """(summary row, detail, the attempt as the turns are derived from it, if it is one) of one
    finished record (as written), by the analyzer's code."""
    from toolproxy.analysis.classify.bodies import decode_body, header
    from toolproxy.analysis.classify.record import analyze_record
    from toolproxy.analysis.measure.runline import delivered_now
    from toolproxy.proxy.liveturns import held_of

    analyzed = analyze_record(rec, "", 0)
    row = analyzed.exchange
    g = rec.get
    status = g("client_status") if g("client_status") is not None else g("status")
    why = orjson.loads(row["record"]).get("classification_detail") if row["record"] else None
    summary = {
        "id": g("id"), "started_at": g("started_at"), "run": row["run"], "episode": g("episode"), "item": g("item"),
        "condition": row["condition"], "method": g("method"), "path": g("path"), "status": status,
        "duration_ms": g("duration_ms"), "error_kind": g("error_kind"), "model": row["model"],
        "outcome": row["outcome"], "sub_kind": row["sub_kind"], "surface": row["surface"], "n_calls": row["n_calls"],
        "delivered": delivered_now(row["outcome"], row["harness_saw_prose"]),
        "detail": why[:BODY_CHARS] if isinstance(why, str) else None,
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
        "calls": [{"name": c["name"], "arguments": (c["arguments_raw"] or "")[:BODY_CHARS], "surface": c["surface"],
                   "valid": c["valid"]} for c in analyzed.calls],
    }
    return summary, detail, held_of(row)


def outcome_key(summary: dict) -> str | None:
    """outcome/surface for an exchange, non_response/sub-kind for a non-response (as the report splits them)."""
    from toolproxy.analysis.measure.runline import composition_key

    return composition_key(summary["outcome"], summary["sub_kind"], summary["surface"])


def _body_chars(rec: Record) -> int:
    """What a record without its line holds, near enough: its bodies."""
    return sum(len(b) for b in (rec.request_body, rec.response_body, rec.client_body) if isinstance(b, str))


def brief(rec: Record) -> tuple:
    """What an exchange is counted by when it is not classified: (run, status class, error,
    started_at). Plain values only: the inbox keeps this and the record's line, not the record,
    so the proxy's heap (and its garbage collector) does not carry records waiting for the view."""
    status = rec.client_status if rec.client_status is not None else rec.status
    # a run tag may hold any byte (a header): kept as its record line stores it, which is also the
    # name the classifier sees, and which the feeder can send as JSON
    run = stored_text(rec.run) if rec.run not in (None, "") else UNTAGGED_RUN
    return run, status_class(status), rec.error_kind, rec.started_at


@dataclasses.dataclass
class RunCounts:
    exchanges: int = 0
    first: float = 0.0
    last: float = 0.0
    by_status_class: Counter = dataclasses.field(default_factory=Counter)
    errors: Counter = dataclasses.field(default_factory=Counter)
    outcomes: Counter = dataclasses.field(default_factory=Counter)  # "outcome/surface" or "non_response/sub_kind"
    unclassified: Counter = dataclasses.field(default_factory=Counter)  # why -> exchanges counted, not classified
    calls: int = 0
    models: Counter = dataclasses.field(default_factory=Counter)
    causes: dict = dataclasses.field(default_factory=dict)  # non-response sub-kind -> what the latest said

    def add(self, s: dict) -> None:
        self._seen(1, s["started_at"], s["started_at"], status_class(s["status"]), s["error_kind"])
        if s["outcome"]:
            self.outcomes[outcome_key(s)] += 1
        self.calls += s["n_calls"] or 0
        if s["outcome"] == "non_response" and s["detail"]:
            self.causes[s["sub_kind"]] = s["detail"][:300]
        if s["model"] and len(self.models) < 20:
            self.models[s["model"]] += 1

    def add_counted(self, cls: str, error: str | None, why: str, n: int, first: float, last: float) -> None:
        self._seen(n, first, last, cls, error)
        self.unclassified[why] += n

    def _seen(self, n: int, first: float, last: float, cls: str, error: str | None) -> None:
        self.exchanges += n
        self.first = min(self.first, first) if self.first else first
        self.last = max(self.last, last)
        self.by_status_class[cls] += n
        if error:
            self.errors[error] += n

    def report(self) -> dict:
        return {
            "exchanges": self.exchanges, "first": self.first, "last": self.last, "calls": self.calls,
            "by_status_class": dict(self.by_status_class), "errors": dict(self.errors),
            "outcomes": dict(self.outcomes), "unclassified": dict(self.unclassified), "models": dict(self.models),
            "causes": dict(self.causes),
        }


class Tally:
    """The classifier process's state: counters per run, each run's attempts (its turns, episodes
    and roles are derived from them when the page asks: toolproxy.proxy.liveturns) and the ring of
    recent exchanges."""

    def __init__(self, recent: int = RECENT, max_runs: int = MAX_RUNS) -> None:
        self.recent: collections.OrderedDict[str, tuple[dict, dict]] = collections.OrderedDict()
        self.recent_max = recent
        self.runs: dict[str, RunCounts] = {}
        self.max_runs = max_runs
        self.observed = 0  # as the proxy last told it
        self.classified = 0
        self.failures = 0
        self.last_failure: str | None = None
        self.unclassified: Counter = Counter()
        self.turns = None  # toolproxy.proxy.liveturns.LiveTurns, once an attempt came (the analyzer loads then)
        self.log = None  # set when this process prints serve's line per exchange (see _classifier)

    def _run(self, name: str) -> RunCounts:
        runs = self.runs
        counts = runs.get(name)
        if counts is None:
            if len(runs) >= self.max_runs:
                quiet = min(runs, key=lambda r: runs[r].last)  # the run quiet the longest
                del runs[quiet]
                if self.turns is not None:
                    self.turns.drop(quiet)
            counts = runs[name] = RunCounts()
        return counts

    def add(self, line: bytes) -> dict | None:
        """Classify one record and count it; its summary (None when the analyzer could not read it)."""
        try:
            summary, detail, held = classify_record(orjson.loads(line))
        except Exception as exc:  # noqa: BLE001 - a record the analyzer chokes on must not stop the view
            self.failures += 1
            self.last_failure = f"{type(exc).__name__}: {exc}"[:300]
            return None
        counts = self._run(summary["run"])
        counts.add(summary)
        if held is not None:
            if self.turns is None:
                from toolproxy.proxy.liveturns import LiveTurns

                self.turns = LiveTurns()
            self.turns.add(summary["run"], held)
        self.recent[summary["id"]] = (summary, detail)
        if len(self.recent) > self.recent_max:
            self.recent.popitem(last=False)
        self.classified += 1
        return summary

    def count(self, counted: dict) -> None:
        """Exchanges the proxy counted without sending them: {(run, class, error, why): (n, first, last)}."""
        for (run, cls, error, why), (n, first, last) in counted.items():
            self._run(run).add_counted(cls, error, why, n, first, last)
            self.unclassified[why] += n

    def report(self, run: str | None, outcome: str | None, limit: int) -> dict[str, Any]:
        runs = {name: {**c.report(), **self._turn_figures(name)} for name, c in sorted(self.runs.items(), key=lambda kv: -kv[1].last)}
        recent = []
        for summary, _ in reversed(self.recent.values()):
            if run and summary["run"] != run:
                continue
            if outcome and outcome not in (summary["outcome"], outcome_key(summary)):
                continue
            recent.append(summary)
            if len(recent) >= limit:
                break
        done = self.classified + self.failures + sum(self.unclassified.values())
        return {"observed": self.observed, "classified": self.classified, "pending": max(0, self.observed - done),
                "unclassified": dict(self.unclassified), "failures": self.failures, "last_failure": self.last_failure,
                "recent_kept": self.recent_max, "runs": runs, "recent": recent}

    def _turn_figures(self, run: str) -> dict:
        """The run's turn figures (worked out now if it changed), and each recent exchange whose call,
        left in the text, its harness acted on marked delivered (as the report's turns say)."""
        figures = self.turns.figures(run) if self.turns is not None else None
        if figures is None:
            return {}
        out = dict(figures)
        for exchange_id in out.pop("through_text"):
            hit = self.recent.get(exchange_id)
            if hit is not None:
                hit[0]["delivered"] = hit[1]["delivered"] = True
        out["derived_by"] = 1  # workers whose turns these are (summed when they are merged)
        return out

    def answer(self, query: list | tuple) -> Any:
        if query[0] == "report":
            return self.report(*query[1:])
        hit = self.recent.get(query[1])
        return hit[1] if hit is not None else None


def merge_reports(reports: list[dict], limit: int) -> dict:
    """One report for several workers' classifiers (pure): counts summed per run, the newest
    `limit` recent exchanges of all of them."""
    out: dict[str, Any] = {"observed": 0, "classified": 0, "pending": 0, "failures": 0, "recent_kept": 0,
                           "unclassified": Counter(), "last_failure": None, "runs": {}, "recent": []}
    for rep in reports:
        for key in ("observed", "classified", "pending", "failures", "recent_kept"):
            out[key] += rep[key]
        out["unclassified"].update(rep["unclassified"])
        out["last_failure"] = out["last_failure"] or rep["last_failure"]
        for name, counts in rep["runs"].items():
            mine = out["runs"].get(name)
            out["runs"][name] = counts if mine is None else _merge_run(mine, counts)
        out["recent"].extend(rep["recent"])
    out["unclassified"] = dict(out["unclassified"])
    out["runs"] = dict(sorted(out["runs"].items(), key=lambda kv: -kv[1]["last"]))
    out["recent"] = sorted(out["recent"], key=lambda s: s["started_at"], reverse=True)[:limit]
    return out


def summarised(name: str, counts: dict) -> dict:
    """A run's counters and what the report says of such counts (analysis.measure.runline): its one line,
    the cells beside it (call, delivered, answered, lost, rej and its cause), its bar's segments,
    and a note when its figures cover only part of the run."""
    from toolproxy.analysis.measure.runline import RunLine, Share, segments

    line = RunLine(name, counts.get("turns", 0), Share(counts.get("valid_turns", 0), counts.get("call_turns", 0)),
                   Share(counts.get("delivered_turns", 0), counts.get("call_turns", 0)),
                   dict(counts.get("turn_non_responses") or {}), counts["causes"], counts.get("episodes"),
                   Share(counts.get("answered", 0), counts.get("answerable", 0)))
    return {**counts, "line": line.text(), "headline": line.cells(), "partial": partial(counts),
            "bar": segments(counts.get("turn_outcomes") or {}, counts.get("delivered_calls", 0))}


def partial(counts: dict) -> str | None:
    """Why a run's turn figures are not the report's, in words, or None."""
    why = []
    unclassified = sum((counts.get("unclassified") or {}).values())
    if unclassified:
        why.append(f"{unclassified:,} of its exchanges were counted without being classified")
    if counts.get("let_go"):
        why.append(f"it outgrew what the page keeps: the figures cover its latest {counts.get('held', 0):,} attempts "
                   f"({counts['let_go']:,} earlier ones let go)")
    if counts.get("not_yet_counted"):
        why.append(f"{counts['not_yet_counted']:,} attempts came since its figures were worked out (a run this large "
                   "is worked out again only every so often)")
    if counts.get("derived_by", 0) > 1:
        why.append(f"its turns were derived per worker ({counts['derived_by']} workers): an episode whose requests "
                   "reached different workers is split there")
    return "; ".join(why) or None


def _merge_run(a: dict, b: dict) -> dict:
    out = {}
    for key, value in a.items():
        other = b.get(key)
        if key == "causes":
            out[key] = {**value, **(other or {})}
        elif key == "first":
            out[key] = min(v for v in (value, other) if v) if (value or other) else 0.0
        elif key == "last":
            out[key] = max(value, other or 0.0)
        elif isinstance(value, dict):
            out[key] = dict(Counter(value) + Counter(other or {}))
        else:
            out[key] = value + (other or 0)
    return out


def ask_peer(path: str | Path, query: list, timeout: float = ASK_TIMEOUT) -> Any:
    """Ask another worker's classifier (blocking: call it off the loop). OSError when it does not answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(orjson.dumps(query) + b"\n")
        chunks = []
        while piece := s.recv(1 << 16):
            chunks.append(piece)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise OSError(f"an incomplete answer ({exc})") from None


def print_lines(text: str) -> None:
    """serve's lines on stdout, whichever process has them; a closed stdout costs no records."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


class LiveView:
    """The proxy's side: takes written records, feeds the classifier process, asks it for reports.

    With `log` (serve's line per record, record -> str), the exchanges' lines are printed once
    classified, by the classifier process, with their outcome; an exchange counted without being
    classified gets its line at once, saying so.
    """

    def __init__(self, *, inbox: int = INBOX, inbox_bytes: int = INBOX_BYTES, recent: int = RECENT,
                 max_runs: int = MAX_RUNS, log: Callable[[Record], str | None] | None = None) -> None:
        self.log = log
        # (brief, line or record, serve's line for it or None, its size): the writer thread
        # appends, the feeder takes.
        self._inbox: collections.deque[tuple[tuple, bytes | Record, str | None, int]] = collections.deque()
        self._inbox_max, self._inbox_bytes_max = inbox, inbox_bytes
        self._inbox_bytes = 0
        self._inbox_lock = threading.Lock()
        self._recent, self._max_runs = recent, max_runs
        self._stopping = threading.Event()
        self._ask = threading.Lock()  # one question at a time on the query pipe
        self._seq = itertools.count()
        self._count_lock = threading.Lock()
        self._counted: dict[tuple, list] = {}  # (run, class, error, why) -> [n, first, last], until the next hand-off
        self.observed = 0
        self.broken: str | None = None
        # Set (by workers.Worker.attach) under `serve --workers N`: where this worker's classifier
        # answers its peers.
        self.socket_path: Path | None = None
        self._proc = None
        self._records = self._queries = None
        self._feeder = threading.Thread(target=self._feed, name="toolproxy-liveview", daemon=True)

    def start(self) -> None:
        rec_out, rec_in = multiprocessing.Pipe(duplex=False)
        self._queries, child_queries = multiprocessing.Pipe()
        self._records = rec_in
        # The child finds toolproxy where this process did (as multiprocessing's spawn would tell it).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        fds = (rec_out.fileno(), child_queries.fileno())
        cmd = [sys.executable, "-m", "toolproxy.proxy.classifier", *map(str, fds),
               str(self.socket_path or ""), str(self._recent), str(self._max_runs)]
        with sigint_ignored():
            self._proc = subprocess.Popen(cmd, pass_fds=fds, env=env, stdin=subprocess.DEVNULL)
        rec_out.close()
        child_queries.close()
        self._feeder.start()

    def _running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """End the feeder and the classifier. The page goes with the proxy and the records are on
        disk, so the classifier's backlog matters only for serve's lines it has yet to print: with
        none to print it is terminated at once; with lines, it gets `timeout` seconds in all to
        print them, then is terminated. It runs on idle CPU time only (SCHED_IDLE), and on a
        saturated machine a slice can take minutes: waiting for its backlog, then for its exit,
        then again, took 10-15 s, past a supervisor's or a test's grace. Terminating it also ends
        a feeder blocked sending to it."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._proc is not None and self.log is None:
            self._proc.terminate()
        if self._feeder.is_alive():
            self._feeder.join(timeout)
        if self._proc is None:
            return
        if self._running() and not self._feeder.is_alive():  # else it is still sending: one writer per pipe
            try:
                self._records.send_bytes(b"")
            except (OSError, ValueError):
                pass
            self._wait(deadline - time.monotonic())
        if self._running():
            self._proc.terminate()
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        try:
            self._proc.wait(max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            pass

    def observe(self, rec: Record, line: bytes | None = None, classifiable: bool = True) -> None:
        """Called by the writer thread per written record, with its JSON line when the writer has
        it (None: the feeder encodes it). An append; a count instead when the inbox is full (the
        oldest goes) or the record cannot be classified in memory (its body was spilled)."""
        if rec.kind != "exchange":  # the proxy's own fingerprint probes are not traffic
            return
        self.observed += 1
        text = self.log(rec) if self.log is not None else None
        if not classifiable:
            self._count(brief(rec), LARGE, text)
            return
        inbox = self._inbox
        size = len(line) if line is not None else _body_chars(rec)
        dropped = []
        with self._inbox_lock:
            inbox.append((brief(rec), rec if line is None else line, text, size))
            self._inbox_bytes += size
            while len(inbox) > self._inbox_max or (self._inbox_bytes > self._inbox_bytes_max and len(inbox) > 1):
                oldest = inbox.popleft()
                self._inbox_bytes -= oldest[3]
                dropped.append(oldest)
        for about, _, said, _ in dropped:  # counted (and its line printed) outside the lock
            self._count(about, BEHIND, said)

    def prints(self, rec: Record) -> bool:
        """Whether this view prints `rec`'s line (the writer then leaves it out)."""
        return self.log is not None and rec.kind == "exchange"

    def _count(self, about: tuple, why: str, text: str | None = None) -> None:
        if text:
            print_lines(f"{text} -> not classified live ({_WHY[why]})\n")
        run, cls, error, started = about
        key = (run, cls, error, why)
        with self._count_lock:
            counted = self._counted
            if key not in counted and len(counted) >= 4 * self._max_runs:
                key = (OTHER_RUNS, *key[1:])  # a flood of distinct run tags: memory stays bounded
            c = counted.get(key)
            if c is None:
                counted[key] = [1, started, started]
            else:
                c[0] += 1
                c[1] = min(c[1], started)
                c[2] = max(c[2], started)

    def _feed(self) -> None:
        """Every FEED_EVERY: what arrived, in messages of at most HANDOFF records (sending waits
        while the classifier is busy with the previous one; observe keeps counting meanwhile).

        A message is bytes, not a pickle: a JSON line (records observed so far, the counts of
        those not sent) then the records' own lines, joined once. Small messages keep each stretch
        this thread holds the GIL short, so the event loop never waits for it long.
        """
        told = -1
        while True:
            stopping = self._stopping.wait(FEED_EVERY)
            while True:
                lines, texts = self._take(HANDOFF)
                with self._count_lock:
                    counted, self._counted = self._counted, {}
                observed = self.observed
                if not (lines or counted or observed != told):
                    break
                head = orjson.dumps([observed, [[*key, *c] for key, c in counted.items()], texts])
                try:
                    self._records.send_bytes(b"".join([head, b"\n", *lines]))
                except (OSError, ValueError) as exc:
                    self.broken = f"the classifier process stopped: {exc}"
                    return
                told = observed
                if len(lines) < HANDOFF:
                    break
            if stopping:
                return

    def _take(self, most: int) -> tuple[list[bytes], list[str | None]]:
        """Up to `most` waiting records' JSON lines, oldest first (encoded here when the writer had
        none), and serve's line for each."""
        inbox, lines, texts = self._inbox, [], []
        while len(lines) < most:
            with self._inbox_lock:
                if not inbox:
                    break
                about, line, text, size = inbox.popleft()
                self._inbox_bytes -= size
            if not isinstance(line, bytes):
                try:
                    line = encode_record(line)
                except Exception:  # noqa: BLE001 - written by the writer, but not encodable again here
                    self._count(about, UNENCODABLE, text)
                    continue
            lines.append(line)
            texts.append(text)
        return lines, texts

    def _question(self, query: tuple) -> Any:
        if self.broken or not self._running():
            self.broken = self.broken or "the classifier process is not running"
            return None
        with self._ask:
            seq = next(self._seq)
            try:
                self._queries.send((seq, query))
                while self._queries.poll(ASK_TIMEOUT):
                    got, answer = self._queries.recv()
                    if got == seq:  # else an older question's answer, late: dropped
                        return answer
            except (OSError, EOFError) as exc:
                self.broken = f"the classifier process stopped: {exc}"
            return None

    def report(self, run: str | None = None, outcome: str | None = None, limit: int = 100,
               peers: Callable[[], list[Path]] | None = None) -> dict[str, Any]:
        """Counters per run and the newest recent exchanges matching the filters, merged with the
        peer workers' (`peers` lists their sockets). Blocks: call it off the loop."""
        query = ("report", run, outcome, limit)
        own = self._question(query)
        problems = []
        if own is None:
            problems.append(self.broken or "this worker's classifier did not answer")
            own = Tally(0, 0).report(None, None, 0)
        else:
            own["observed"] = self.observed  # fresher than the classifier's copy
            own["pending"] = max(0, self.observed - own["classified"] - own["failures"] - sum(own["unclassified"].values()))
        reports = [own]
        for path in peers() if peers is not None else ():
            try:
                reports.append(ask_peer(path, list(query)))
            except OSError as exc:
                problems.append(f"the worker answering on {Path(path).name} did not: {exc}")
        merged = merge_reports(reports, limit)
        merged["runs"] = {name: summarised(name, counts) for name, counts in merged["runs"].items()}
        merged["workers"] = len(reports)
        merged["problems"] = problems
        merged["broken"] = self.broken
        return merged

    def detail(self, exchange_id: str, peers: Callable[[], list[Path]] | None = None) -> dict | None:
        """One recent exchange's request and response, from whichever worker holds it. Blocks: call it off the loop."""
        found = self._question(("detail", exchange_id))
        for path in peers() if found is None and peers is not None else ():
            try:
                found = ask_peer(path, ["detail", exchange_id])
            except OSError:
                continue
            if found is not None:
                break
        return found
