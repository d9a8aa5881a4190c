"""The proxy's side of the live page (per-run counts and recent exchanges, classified as they
finish): it takes the written records, feeds the classifier process, and asks it for reports.

The writer thread hands every record it has written to `LiveView.observe`, with the JSON line it
already encoded when it has one; observe only appends that line (or the record, when there is
none) to a bounded deque. A feeder thread wakes every FEED_EVERY, encodes what came without a
line, and sends what arrived in messages of at most HANDOFF records to a classifier *process*,
which classifies each record with the analyzer's own per-record code (toolproxy.live.classify) and
keeps the counters, the recent exchanges and each run's attempts (toolproxy.live.tally), from
which it derives turns, episodes and roles as the report does when the page asks
(toolproxy.live.turns). Classifying
costs about as much CPU as forwarding, so it cannot share the proxy's interpreter (the GIL), and
the classifier process runs only on CPU time nothing else wants. The page's requests ask it for a report off the loop.

The proxy never waits for the classifier. When it falls behind, the inbox lets its oldest records
go unclassified: they are still counted (run, status class, error), as `unclassified` with the
reason, so the page's exchange counts stay those of the proxy and it says how many turns it could
not classify. Bodies spilled to disk (too large to hold in memory) are counted the same way.

Memory is bounded whatever the traffic: the inbox holds at most INBOX records and INBOX_BYTES of
them (a count alone let a flood of long contexts hold hundreds of megabytes, and even short ones,
held while the classifier is starved, spread over the proxy's heap), and what the classifier
keeps is bounded too (toolproxy.live.tally).

Under `serve --workers N` every worker has its own classifier, which also answers on a Unix
socket in the group's private directory, so whichever worker serves the page merges its peers'
counts and recent exchanges with its own (`tally.merge_reports`), and finds an exchange a peer holds.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from toolproxy.live.classify import status_class
from toolproxy.live.tally import MAX_RUNS, RECENT, Tally, merge_reports, summarised
from toolproxy.record.model import Record, encode_record, stored_text
from toolproxy.runtime.children import sigint_ignored

PAGE = resources.files("toolproxy.live").joinpath("page.html")
INBOX = 1_000
INBOX_BYTES = 1 << 20
FEED_EVERY = 0.05  # seconds between the feeder's hand-offs
HANDOFF = 256  # records per message to the classifier at most
ASK_TIMEOUT = 5.0
UNTAGGED_RUN = "(untagged)"  # as the analyzer names it
OTHER_RUNS = "(other runs)"

# Why an exchange was counted without being classified.
BEHIND = "behind"  # the classifier could not keep up
LARGE = "large"  # a body was spilled to disk while it passed: too large to classify in memory
UNENCODABLE = "unencodable"
_WHY = {
    BEHIND: "the classifier is behind",
    LARGE: "a body too large to hold in memory",
    UNENCODABLE: "the record could not be encoded again",
}


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

    def __init__(
        self,
        *,
        inbox: int = INBOX,
        inbox_bytes: int = INBOX_BYTES,
        recent: int = RECENT,
        max_runs: int = MAX_RUNS,
        log: Callable[[Record], str | None] | None = None,
    ) -> None:
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
        cmd = [
            sys.executable,
            "-m",
            "toolproxy.live.classifier",
            *map(str, fds),
            str(self.socket_path or ""),
            str(self._recent),
            str(self._max_runs),
        ]
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

    def page(self, nonce: str) -> str:
        """The page (one file: inline CSS and JS, nothing from the network), its script and style
        marked with `nonce`, the only ones the admin route's Content-Security-Policy lets run."""
        return PAGE.read_text(encoding="utf-8").replace("{{nonce}}", nonce)

    def report(
        self,
        run: str | None = None,
        outcome: str | None = None,
        limit: int = 100,
        peers: Callable[[], list[Path]] | None = None,
    ) -> dict[str, Any]:
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
            own["pending"] = max(
                0, self.observed - own["classified"] - own["failures"] - sum(own["unclassified"].values())
            )
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
