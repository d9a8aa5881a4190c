"""Turns ordered by what conversations contain, not by clocks: replicas on several hosts stamp
exchanges with clocks that may disagree, and the episodes must come out the same whatever order
those clocks put the attempts in."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from test_turns import REPLY1, REPLY2, SYS, TURN1, TURN2, TURN3, attempt, shape

from toolproxy.analysis.episodes.build import build_episodes
from toolproxy.analysis.episodes.order import causal_order

OTHER = [SYS, {"role": "user", "content": "Something else"}]


def untagged():
    return [
        attempt("a1", TURN1, REPLY1),
        attempt("a2", TURN2, REPLY2),
        attempt("a3", TURN3, ("Oslo 5C, Paris 9C.", [])),
        attempt("b1", OTHER, ("Sure.", [])),
    ]


def retried(episode=None):
    """A tagged episode retried on its first and second turn; untagged, on its second only (see
    test_retries_of_an_untagged_first_turn_keep_clock_order)."""
    first = [attempt("a1", TURN1, outcome="non_response", sub_kind="http_5xx", episode=episode)] if episode else []
    return first + [
        attempt("a2", TURN1, REPLY1, episode=episode),
        attempt("a3", TURN2, outcome="non_response", sub_kind="timeout", episode=episode),
        attempt("a4", TURN2, REPLY2, episode=episode),
        attempt("a5", TURN3, ("Oslo 5C, Paris 9C.", []), episode=episode),
        attempt("b1", OTHER, ("Sure.", []), episode=episode and "8"),
    ]


def canonical(episodes):
    return sorted(
        (ep.key, [[a.id for a in t.attempts] for t in ep.turns], [t.result() for t in ep.turns]) for ep in episodes
    )


@pytest.mark.parametrize(
    "make, expected",
    [
        (untagged, [[["a1"], ["a2"], ["a3"]], [["b1"]]]),
        (retried, [[["a2"], ["a3", "a4"], ["a5"]], [["b1"]]]),
        (lambda: retried("7"), [[["a1", "a2"], ["a3", "a4"], ["a5"]], [["b1"]]]),
    ],
)
def test_every_clock_order_gives_the_episodes_of_the_true_order(make, expected):
    true_order = make()
    assert shape(build_episodes("r", true_order)) == expected
    reference = canonical(build_episodes("r", true_order))
    for order in itertools.permutations(true_order):
        assert canonical(build_episodes("r", list(order))) == reference, [a.id for a in order]


def ordered(attempts):
    return [attempts[i].id for i in causal_order(attempts)]


@pytest.mark.parametrize("make", [untagged, retried, lambda: retried("7")])
def test_an_order_the_clocks_got_right_is_kept(make):
    attempts = make()
    assert ordered(attempts) == [a.id for a in attempts]


def test_unrelated_attempts_keep_their_clock_order_around_a_moved_one():
    """Only what content orders moves: a turn the clock put before its parent goes right after it."""
    a1, a2, a3, b1 = untagged()
    assert ordered([a2, b1, a1, a3]) == ["b1", "a1", "a2", "a3"]
    assert ordered([a3, a2, a1, b1]) == ["a1", "a2", "a3", "b1"]


def test_failures_of_one_turn_that_the_clock_cannot_order_keep_clock_order():
    """Which of two failed attempts came last is not in their content: clock order decides, so the
    turn keeps the cause of whichever the clock put last."""
    first = attempt("f1", TURN1, outcome="non_response", sub_kind="http_5xx")
    second = attempt("f2", TURN1, outcome="non_response", sub_kind="timeout")
    for order, cause in (([first, second], "timeout"), ([second, first], "http_5xx")):
        (ep,) = build_episodes("r", order)
        assert [len(t.attempts) for t in ep.turns] == [2] and ep.turns[0].result() == ("non_response", cause)


def test_retries_of_an_untagged_first_turn_keep_clock_order():
    """Without an episode tag or a turn before it, a failed first request and an answered one
    could be one turn retried or two episodes that began alike (the same item run twice): content
    cannot tell, so the clock does, as on one host."""
    fail = attempt("f1", TURN1, outcome="non_response", sub_kind="http_5xx")
    ok = attempt("o1", TURN1, REPLY1)
    assert shape(build_episodes("r", [fail, ok])) == [[["f1", "o1"]]]
    assert shape(build_episodes("r", [ok, fail])) == [[["o1"]], [["f1"]]]


def test_many_identical_conversations_each_follow_a_turn_they_continue():
    """A benchmark runs the same item in many episodes: their turns share chain keys, and finding
    a turn's parent among them is a binary search, not a scan of them all."""
    attempts = [
        attempt(f"{k}.{t}", turn, reply)
        for k in range(3000)
        for t, (turn, reply) in enumerate([(TURN1, REPLY1), (TURN2, REPLY2)])
    ]
    assert ordered(attempts) == [a.id for a in attempts]
    # Every second turn first, as if the clocks were all wrong: each comes after a first turn it
    # continues (which of the identical ones is for the clocks to say: see causal_order).
    order = ordered(attempts[1::2] + attempts[0::2])
    assert sorted(order) == sorted(a.id for a in attempts)
    assert order[0] == "0.0" and all(x.endswith(".1") for x in order[1:3001])


def test_a_cycle_from_colliding_hashes_loses_no_attempt():
    a, b, c = untagged()[:3]
    a = replace(a, parent_hashes=[b.chain_hash])
    b = replace(b, parent_hashes=[a.chain_hash])
    assert sorted(ordered([a, b, c])) == ["a1", "a2", "a3"]


def test_a_retry_stamped_by_a_clock_behind_is_still_a_retry():
    """Replica B's clock runs 10 s behind A's: the retry B served reads as started before the
    failed attempt A served had ended. Under several clocks times are not compared, so it is still
    that turn's retry; on one clock the same stamps would mean another conversation's request."""
    attempts = retried()
    stamps = {"a2": (0, 1), "a3": (10, 25), "a4": (16, 17), "a5": (30, 31), "b1": (40, 41)}
    for a in attempts:
        a.started, a.ended = stamps[a.id]
    assert shape(build_episodes("r", attempts)) == [[["a2"], ["a3", "a4"], ["a5"]], [["b1"]]]
