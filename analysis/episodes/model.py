"""The Attempt, Turn and Episode types episode building works on.

An attempt is one exchange as episode building needs it (its outcome, its conversation keys); a
turn is the attempts of one request (a harness's retries after failures), whose outcome is the
last attempt's; an episode is the turns of one task, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson


@dataclass(slots=True)
class Attempt:
    """What grouping an attempt into its turn and episode needs of it. What a turn copies from its
    final attempt (model, surface, content, ...) derive() joins from exchanges in SQL."""

    id: str
    episode: str | None
    item: str | None
    category: str | None
    condition: str | None
    outcome: str
    sub_kind: str | None
    harness_saw_prose: bool
    state_hash: str | None
    chain_hash: str | None
    parent_hashes: list[str]
    item_hash: str | None
    call_signature: str | None
    tags: str | None = None
    tool_results: int = 0
    reply_keys: list[str] = field(default_factory=list)
    rejects: bool = False  # its request says the harness could not use the reply before it
    offered: bool = True  # its request offered tools (in a `tools` field or its prompt)
    # its parent keys beyond parent_hashes start here and follow prefix_links (keys.parent_walk)
    prior_hash: str | None = None
    prefix_links: list[str] = field(default_factory=list)
    # when the request started and its answer ended (seconds; None when the record has no time):
    # a retry comes after the attempt it repeats has failed
    started: float | None = None
    ended: float | None = None
    thread: str | None = None  # keys.thread_key of its conversation (a wrap-up's fallback: build_episodes)


def attempt_of(row: dict, share=lambda value: value) -> Attempt:
    """The Attempt of an exchanges row as analysis.classify.record makes it (what derive's _ATTEMPTS_SQL
    reads back of it). `share` maps each string that repeats along a run (its tags, outcome, the
    conversation keys later requests name again) to the object to keep, so it is held once."""
    tags = orjson.loads(row["tags"]) if row.get("tags") else {}
    category = tags.get("category") if isinstance(tags, dict) else None
    if category is not None and not isinstance(category, str):
        category = orjson.dumps(category).decode()
    kept = [
        None if v is None else share(v)
        for v in (row["episode"], row["item"], category, row["condition"], row["outcome"], row["sub_kind"], row["tags"])
    ]
    episode, item, category, condition, outcome, sub_kind, tags_text = kept
    return Attempt(
        row["id"],
        episode,
        item,
        category,
        condition,
        outcome,
        sub_kind,
        bool(row["harness_saw_prose"]),
        row["state_hash"],
        row["chain_hash"],
        [share(k) for k in row["parent_hashes"] or ()],
        row["item_hash"],
        row["call_signature"],
        tags_text,
        row["tool_results"] or 0,
        [share(k) for k in row["reply_keys"] or ()],
        bool(row["rejects"]),
        row["tool_set"] is not None,
        row["prior_hash"],
        [share(k) for k in row["prefix_links"] or ()],
        row.get("started_at"),
        row.get("ended_at"),
        row.get("thread"),
    )


@dataclass(slots=True)
class Turn:
    attempts: list[Attempt]

    @property
    def final(self) -> Attempt:
        return self.attempts[-1]

    def result(self) -> tuple[str, str | None]:
        """(outcome, sub_kind): the final attempt's. When every retry failed, the cause stays named
        (`refused`, `http_5xx`, ...) and the attempt count is the turn's n_attempts."""
        f = self.final
        return f.outcome, f.sub_kind


@dataclass(slots=True)
class Episode:
    key: str
    name: str
    reconstructed: bool
    turns: list[Turn] = field(default_factory=list)
    item_key: str | None = None
    category: str | None = None
    looping: bool = False
    loop_reason: str | None = None
    # What later requests name its turns by (reconstructed only), with repeats (a retry's keys are
    # its turn's): a set per episode took four times the memory of the list.
    keys: list[str] = field(default_factory=list)
