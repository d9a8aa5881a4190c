"""The live page's turns, episodes and roles: the analyzer's own code over the attempts the live
classifier holds, so the page counts what the report counts.

Counting exchanges cannot say what the report says: a harness's retries of one request are one
turn, prose the harness nudged after is a missed call (not an answer), a call the harness parsed
out of the text itself was delivered. So the classifier keeps each run's attempts (as
analysis.episodes.model.Attempt) and, when the page asks, groups them with analysis.episodes.build.build_episodes,
gives each turn its place (turn_facts), its expectation (from its tags: rules given to `analyze
--expect` are not known here) and its role (analysis.episodes.roles.role_of, ROLE_SQL's own rules), and
counts them as analysis.measure.metrics does. Only a run that changed since the page last asked is
worked out again.

Bounded: at most ATTEMPTS_PER_RUN attempts of a run and ATTEMPTS_HELD in all are kept (an attempt
holds its conversation keys: about 1.5 KB, strings that repeat along a run held once). Past that a
run's oldest quarter is let go, and its figures say they cover only the attempts kept: an episode
whose start was let go is then counted from where the figures begin. Working a run out costs
tens of microseconds an attempt; a run whose last working-out took longer than QUICK is worked out
again at most once per REDO_FACTOR times that (its figures then say how many attempts came since),
so a page left open on a busy proxy keeps the classifier's share of the CPU small.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass

from toolproxy.analysis.classify.outcomes import CALL, NON_RESPONSE, VALID_CALL
from toolproxy.analysis.episodes.build import build_episodes, episode_expectation
from toolproxy.analysis.episodes.model import Attempt, attempt_of
from toolproxy.analysis.episodes.roles import role_of, turn_facts
from toolproxy.analysis.measure.runline import composition_key

ATTEMPTS_PER_RUN = 5_000
ATTEMPTS_HELD = 10_000
QUICK = 0.05  # CPU seconds: a working-out this quick is redone whenever the run changed
REDO_FACTOR = 10


@dataclass(slots=True)
class Held:
    """An attempt as the live view keeps it: what build_episodes needs, and what a turn's role
    reads of its final attempt."""

    attempt: Attempt
    started_at: float
    finishes: bool
    finisher: str | None
    surface: str | None  # of its call (the composition's key)


def held_of(row: dict) -> Held | None:
    """An analysed exchange row (analysis.classify.record) as the live view keeps it; None when it is no
    turn of a task (not a model request, or a harness's probe)."""
    if not row.get("is_attempt"):
        return None
    surface = row["surface"]
    return Held(
        attempt_of(row, sys.intern),
        float(row["started_at"] or 0.0),
        bool(row["finishes"]),
        row["finisher"],
        None if surface is None else sys.intern(surface),
    )


class RunTurns:
    """One run's attempts and, once worked out, its figures."""

    def __init__(self) -> None:
        self.held: list[Held] = []
        self.let_go = 0
        self._figures: dict | None = None
        self._since = 0  # attempts added since the figures were worked out
        self._done_at = self._cost = 0.0

    def add(self, held: Held) -> None:
        self.held.append(held)
        self._since += 1

    def trim(self) -> int:
        """Let the oldest quarter go; how many."""
        n = max(1, len(self.held) // 4)
        del self.held[:n]
        self.let_go += n
        self._since += 1
        return n

    def figures(self, run: str) -> dict:
        now = time.monotonic()
        if self._figures is None or (
            self._since and (self._cost < QUICK or now - self._done_at >= REDO_FACTOR * self._cost)
        ):
            cpu = time.process_time()  # the CPU it took, not the wall time a starved process waited
            self._since = 0
            self._figures = self._work_out(run)
            self._done_at = time.monotonic()
            self._cost = time.process_time() - cpu
        return {**self._figures, "not_yet_counted": self._since} if self._since else self._figures

    def _work_out(self, run: str) -> dict:
        ordered = sorted(self.held, key=lambda h: (h.started_at, h.attempt.id))  # as derive reads them
        extra = {h.attempt.id: h for h in ordered}
        roles: Counter = Counter()
        outcomes: Counter = Counter()
        non_responses: Counter = Counter()
        call_k = call_n = delivered_k = answered = answerable = delivered_valid = 0
        through_text: list[str] = []  # exchanges whose call, left in text, the harness acted on
        episodes = build_episodes(run, [h.attempt for h in ordered], one_clock=True)
        for ep in episodes:
            _, expect = episode_expectation(run, ep, ())
            ep_roles = set()
            for turn, facts in zip(ep.turns, turn_facts(ep.turns)):
                final = turn.final
                h = extra[final.id]
                role = role_of(
                    {
                        "outcome": final.outcome,
                        "offered_tools": final.offered,
                        "expect": expect,
                        "rejected": facts.rejected,
                        "last_with_tools": facts.last_with_tools,
                        "is_last": facts.is_last,
                        "finishes": h.finishes,
                        "finisher": h.finisher,
                        "saw_result": facts.saw_result,
                    }
                )
                outcomes[composition_key(final.outcome, final.sub_kind, h.surface)] += 1
                if final.outcome == NON_RESPONSE:
                    non_responses[final.sub_kind or "unknown"] += 1
                    continue
                roles[role] += 1
                ep_roles.add(role)
                if final.outcome == VALID_CALL and facts.delivered:
                    delivered_valid += 1
                    if final.harness_saw_prose:
                        through_text.append(final.id)
                if role == CALL:
                    call_n += 1
                    call_k += final.outcome == VALID_CALL
                    delivered_k += facts.delivered
            answered += "answer" in ep_roles
            answerable += bool(ep_roles & {"call", "answer", "open"})
        return {
            "turns": sum(outcomes.values()),
            "episodes": len(episodes),
            "roles": dict(roles),
            "call_turns": call_n,
            "valid_turns": call_k,
            "delivered_turns": delivered_k,
            "answered": answered,
            "answerable": answerable,
            "turn_outcomes": dict(outcomes),
            "turn_non_responses": dict(non_responses),
            "delivered_calls": delivered_valid,
            "held": len(self.held),
            "let_go": self.let_go,
            "through_text": through_text,
        }


class LiveTurns:
    """Every run's RunTurns, within the bounds."""

    def __init__(self, per_run: int = ATTEMPTS_PER_RUN, total: int = ATTEMPTS_HELD) -> None:
        self.runs: dict[str, RunTurns] = {}
        self.per_run, self.total = per_run, total
        self.held = 0

    def add(self, run: str, held: Held) -> None:
        turns = self.runs.get(run)
        if turns is None:
            turns = self.runs[run] = RunTurns()
        turns.add(held)
        self.held += 1
        if len(turns.held) > self.per_run:
            self.held -= turns.trim()
        while self.held > self.total:
            self.held -= max(self.runs.values(), key=lambda t: len(t.held)).trim()

    def drop(self, run: str) -> None:
        turns = self.runs.pop(run, None)
        if turns is not None:
            self.held -= len(turns.held)

    def figures(self, run: str) -> dict | None:
        turns = self.runs.get(run)
        return turns.figures(run) if turns is not None else None
