"""A produced turn's role: what it was for, and so which metric counts it.

One definition, written once as rules over a turn's columns and read two ways: as SQL (ROLE_SQL),
which the analyzer stores and a report recomputes under an analyst's expectation rules, and in
Python (role_of), which the live page runs over the turns it derives in memory. Both follow SQL's
three-valued logic, so a column left NULL (a store derived before it existed) reads the same.

  no_tools  the request offered no tools (left out of every tool metric)
  abstain   the item expects no call (scored by restraint)
  call      any call attempt, or prose the harness answered with another turn offering tools (it
            had to nudge), or a reply the harness rejected (analysis.classify.harnesses), or prose where
            the harness ends only by its finishing tool
  answer    prose, or the harness's finishing call (smolagents' final_answer, inspect-ai's submit,
            mini-swe-agent's submit command, dspy's finish), ending the episode's tool use after
            a tool result came back
  call      the same ending an item that expects a call
  open      the same ending an episode that saw no tool result and has no expectation: unknowable

An episode's tool use ends with its last turn that offered tools: a harness may wrap up after it
with a request that offers none (dspy's extract step, smolagents' summary at max_steps), and that
turn is `no_tools`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from toolproxy.analysis.classify.outcomes import ABSTAIN, ANSWER, CALL, NO_TOOLS, NON_RESPONSE, OPEN, PROSE, VALID_CALL
from toolproxy.analysis.episodes.model import Turn


class _Expr:
    def sql(self) -> str:
        raise NotImplementedError

    def value(self, row: Mapping[str, Any]) -> Any:
        """The value under SQL's rules: None is NULL."""
        raise NotImplementedError


@dataclass(frozen=True)
class _Col(_Expr):
    """A turn column, `otherwise` (a constant or another column) where it is NULL."""

    name: str
    otherwise: Any = None

    def sql(self) -> str:
        if self.otherwise is None:
            return self.name
        other = self.otherwise.sql() if isinstance(self.otherwise, _Expr) else str(self.otherwise).lower()
        return f"coalesce({self.name}, {other})"

    def value(self, row):
        v = row.get(self.name)
        if v is None:
            return self.otherwise.value(row) if isinstance(self.otherwise, _Expr) else self.otherwise
        return v


@dataclass(frozen=True)
class _Is(_Expr):
    column: _Col
    constant: str

    def sql(self) -> str:
        return f"{self.column.sql()} = '{self.constant}'"

    def value(self, row):
        v = self.column.value(row)
        return None if v is None else v == self.constant


@dataclass(frozen=True)
class _Null(_Expr):
    column: _Col

    def sql(self) -> str:
        return f"{self.column.sql()} IS NULL"

    def value(self, row):
        return self.column.value(row) is None


@dataclass(frozen=True)
class _Not(_Expr):
    inner: _Expr

    def sql(self) -> str:
        return f"NOT ({self.inner.sql()})"

    def value(self, row):
        v = self.inner.value(row)
        return None if v is None else not v


@dataclass(frozen=True)
class _Join(_Expr):
    """parts joined by OR (any) or AND (all)."""

    word: str
    parts: tuple

    def sql(self) -> str:
        return "(" + f" {self.word} ".join(p.sql() for p in self.parts) + ")"

    def value(self, row):
        values = [p.value(row) for p in self.parts]
        decisive = self.word == "OR"  # the value that settles it: a true part of an OR, a false one of an AND
        return decisive if decisive in values else None if None in values else not decisive


def _any(*parts: _Expr) -> _Join:
    return _Join("OR", parts)


def _all(*parts: _Expr) -> _Join:
    return _Join("AND", parts)


_OUTCOME = _Col("outcome")
# What may end an episode as its answer: the harness's finishing call, or prose where the harness
# has no finishing tool of its own.
_ANSWERS = _any(_Col("finishes", False), _all(_Is(_OUTCOME, PROSE), _Null(_Col("finisher"))))
# (role, when), tried in order; a turn none fits is `open`.
RULES: tuple[tuple[str | None, _Expr], ...] = (
    (None, _Is(_OUTCOME, NON_RESPONSE)),
    (NO_TOOLS, _Not(_Col("offered_tools"))),
    (ABSTAIN, _Is(_Col("expect"), "none")),
    (CALL, _any(_Col("rejected", False), _Not(_Col("last_with_tools", _Col("is_last"))), _Not(_ANSWERS))),
    (ANSWER, _Col("saw_result")),
    (CALL, _Is(_Col("expect"), "call")),
)
OTHERWISE = OPEN
# The columns the rules read.
COLUMNS = (
    "outcome",
    "offered_tools",
    "expect",
    "rejected",
    "last_with_tools",
    "is_last",
    "finishes",
    "finisher",
    "saw_result",
)

ROLE_SQL = (
    "CASE\n"
    + "".join(f"    WHEN {when.sql()} THEN {'NULL' if role is None else repr(role)}\n" for role, when in RULES)
    + f"    ELSE '{OTHERWISE}' END"
)


def role_of(row: Mapping[str, Any]) -> str | None:
    """ROLE_SQL for one turn's columns (a mapping holding COLUMNS; a missing one is NULL)."""
    for role, when in RULES:
        if when.value(row) is True:
            return role
    return OTHERWISE


def delivered(turns: Sequence[Turn], i: int) -> bool:
    """Did turn i's valid call reach the harness as a call it acted on?

    A call in tool_calls (the stack's, or one a condition produced) was delivered. A call left in
    the reply text counts only when the harness parsed it itself and acted on it, which shows as
    the episode's next request carrying more tool results than this one (smolagents and other
    text-protocol harnesses) and not saying it could not use the reply; a harness that ignored it
    got prose.
    """
    f = turns[i].final
    if f.outcome != VALID_CALL:
        return False
    if not f.harness_saw_prose:
        return True
    if i + 1 >= len(turns):
        return False
    after = turns[i + 1].attempts[0]
    return after.tool_results > f.tool_results and not after.rejects


class TurnFacts(NamedTuple):
    """What a turn's place in its episode says of it (the rest of a turn is its final attempt's)."""

    delivered: bool  # its valid call reached the harness as a call (see delivered)
    saw_result: bool  # a tool result came back in the episode by this turn
    is_last: bool
    rejected: bool  # the next request says the harness could not use this reply
    last_with_tools: bool  # no later turn of the episode offered tools


def turn_facts(turns: Sequence[Turn]) -> list[TurnFacts]:
    """TurnFacts of each turn of one episode, in order."""
    last = len(turns) - 1
    last_tools = max((i for i, t in enumerate(turns) if t.attempts[-1].offered), default=-1)
    out = []
    saw_result = False
    for i, turn in enumerate(turns):
        saw_result = saw_result or turn.attempts[-1].tool_results > 0
        out.append(
            TurnFacts(
                delivered(turns, i), saw_result, i == last, i < last and _rejected(turn, turns[i + 1]), i == last_tools
            )
        )
    return out


def _rejected(turn: Turn, after: Turn) -> bool:
    """Whether the harness could not use `turn`'s reply, by the next turn of its episode: the request
    says so, or asks exactly what `turn` asked (dspy's fallback format after fields it could not parse)."""
    head = after.attempts[0]
    return head.rejects or (head.state_hash is not None and head.state_hash == turn.attempts[-1].state_hash)
