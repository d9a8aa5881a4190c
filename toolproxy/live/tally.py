"""What the classifier process keeps: counters per run, each run's attempts and the ring of
recent exchanges (Tally), and the one report several workers' tallies make (merge_reports),
with what the report says of each run's counts (summarised).

Bounded whatever the traffic: the recent list is a ring of RECENT exchanges, the per-run counters
are integers for at most MAX_RUNS runs (the run quiet the longest goes first), and the attempts
kept for the turns are bounded per run and in all (toolproxy.live.turns).
"""

from __future__ import annotations

import collections
import dataclasses
from collections import Counter
from typing import Any

import orjson

from toolproxy.live.classify import classify_record, outcome_key, status_class

RECENT = 300
MAX_RUNS = 200


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
    # what the harness asked for itself beside its tasks, by kind (analysis.classify.sides): counted
    # here, not by status (a preconnect HEAD's 404 is no failure of the run)
    side_requests: Counter = dataclasses.field(default_factory=Counter)

    def add(self, s: dict) -> None:
        side = s.get("side_request")
        if side:
            self.side_requests[side] += 1
        self._seen(1, s["started_at"], s["started_at"], "side" if side else status_class(s["status"]), s["error_kind"])
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
            "exchanges": self.exchanges,
            "first": self.first,
            "last": self.last,
            "calls": self.calls,
            "by_status_class": dict(self.by_status_class),
            "errors": dict(self.errors),
            "outcomes": dict(self.outcomes),
            "unclassified": dict(self.unclassified),
            "models": dict(self.models),
            "causes": dict(self.causes),
            "side_requests": dict(self.side_requests),
        }


class Tally:
    """The classifier process's state: counters per run, each run's attempts (its turns, episodes
    and roles are derived from them when the page asks: toolproxy.live.turns) and the ring of
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
        self.turns = None  # toolproxy.live.turns.LiveTurns, once an attempt came (the analyzer loads then)
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
                from toolproxy.live.turns import LiveTurns

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
        runs = {
            name: {**c.report(), **self._turn_figures(name)}
            for name, c in sorted(self.runs.items(), key=lambda kv: -kv[1].last)
        }
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
        return {
            "observed": self.observed,
            "classified": self.classified,
            "pending": max(0, self.observed - done),
            "unclassified": dict(self.unclassified),
            "failures": self.failures,
            "last_failure": self.last_failure,
            "recent_kept": self.recent_max,
            "runs": runs,
            "recent": recent,
        }

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
    out: dict[str, Any] = {
        "observed": 0,
        "classified": 0,
        "pending": 0,
        "failures": 0,
        "recent_kept": 0,
        "unclassified": Counter(),
        "last_failure": None,
        "runs": {},
        "recent": [],
    }
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

    line = RunLine(
        name,
        counts.get("turns", 0),
        Share(counts.get("valid_turns", 0), counts.get("call_turns", 0)),
        Share(counts.get("delivered_turns", 0), counts.get("call_turns", 0)),
        dict(counts.get("turn_non_responses") or {}),
        counts["causes"],
        counts.get("episodes"),
        Share(counts.get("answered", 0), counts.get("answerable", 0)),
        dict(counts.get("side_requests") or {}),
    )
    return {
        **counts,
        "line": line.text(),
        "headline": line.cells(),
        "partial": partial(counts),
        "bar": segments(counts.get("turn_outcomes") or {}, counts.get("delivered_calls", 0)),
    }


def partial(counts: dict) -> str | None:
    """Why a run's turn figures are not the report's, in words, or None."""
    why = []
    unclassified = sum((counts.get("unclassified") or {}).values())
    if unclassified:
        why.append(f"{unclassified:,} of its exchanges were counted without being classified")
    if counts.get("let_go"):
        why.append(
            f"it outgrew what the page keeps: the figures cover its latest {counts.get('held', 0):,} attempts "
            f"({counts['let_go']:,} earlier ones let go)"
        )
    if counts.get("not_yet_counted"):
        why.append(
            f"{counts['not_yet_counted']:,} attempts came since its figures were worked out (a run this large "
            "is worked out again only every so often)"
        )
    if counts.get("derived_by", 0) > 1:
        why.append(
            f"its turns were derived per worker ({counts['derived_by']} workers): an episode whose requests "
            "reached different workers is split there"
        )
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
