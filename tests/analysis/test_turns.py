"""Attempts -> turns -> episodes: retries, prefix-chaining reconstruction, item keys, loops."""

from __future__ import annotations

import pytest

from toolproxy.analysis.classify.keys import call_signature, conversation_keys
from toolproxy.analysis.episodes.build import build_episodes, category_of
from toolproxy.analysis.episodes.loops import loop_reason
from toolproxy.analysis.episodes.model import Attempt

SYS = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Weather in Oslo, then Paris?"}


def call_msg(name, args, cid):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}],
    }


def attempt(
    aid,
    messages,
    reply=None,
    *,
    outcome="valid_call",
    sub_kind=None,
    episode=None,
    item=None,
    category=None,
    calls=None,
    tools=("get_weather",),
    ids=(),
):
    keys = conversation_keys(messages, tool_set="ts1", tool_names=list(tools), model="m", reply=reply, reply_ids=ids)
    return Attempt(
        id=aid,
        episode=episode,
        item=item,
        category=category,
        condition="native",
        outcome=outcome,
        sub_kind=sub_kind,
        harness_saw_prose=False,
        state_hash=keys.state_hash,
        chain_hash=keys.chain_hash,
        parent_hashes=keys.parent_hashes,
        prior_hash=keys.prior_hash,
        prefix_links=keys.prefix_links,
        item_hash=keys.item_hash,
        call_signature=call_signature(calls or []),
        reply_keys=keys.reply_keys,
        rejects=keys.rejects,
    )


def shape(episodes):
    return [[[a.id for a in t.attempts] for t in ep.turns] for ep in episodes]


TURN1 = [SYS, USER]
REPLY1 = (None, [("get_weather", '{"city":"Oslo"}')])
# The harness resends the reply with different id, spacing and key order: still the same conversation.
TURN2 = TURN1 + [
    call_msg("get_weather", '{ "city": "Oslo" }', "call_abc"),
    {"role": "tool", "tool_call_id": "call_abc", "content": "5C"},
]
REPLY2 = (None, [("get_weather", '{"city":"Paris"}')])
TURN3 = TURN2 + [
    call_msg("get_weather", '{"city":"Paris"}', "call_def"),
    {"role": "tool", "tool_call_id": "call_def", "content": "9C"},
]


def test_untagged_episode_reconstructed_by_prefix_chaining():
    eps = build_episodes(
        "r",
        [
            attempt("a1", TURN1, REPLY1),
            attempt("b1", [SYS, {"role": "user", "content": "Something else"}], ("Sure.", [])),
            attempt("a2", TURN2, REPLY2),
            attempt("a3", TURN3, ("Oslo 5C, Paris 9C.", [])),
        ],
    )
    assert shape(eps) == [[["a1"], ["a2"], ["a3"]], [["b1"]]]
    assert all(ep.reconstructed for ep in eps)
    assert eps[0].item_key.startswith("h:") and eps[0].item_key != eps[1].item_key
    assert eps[0].key == "r/~a1"


def test_placed_attempts_stay_where_they_were_derived_and_later_ones_chain_from_there():
    """derive_changes passes the attempts it derived before as placed: they keep their episodes and
    turns (a retry its turn) even where chaining them again among fewer turns would put them
    elsewhere, and a new attempt continues the turn it names in its episode."""
    failed = attempt("a2", TURN2, outcome="non_response", sub_kind="http_5xx")
    placed = {"a1": ("~a1", "a1"), "a2": ("~a2", "a2"), "a2r": ("~a2", "a2")}
    eps = build_episodes(
        "r",
        [
            attempt("a1", TURN1, REPLY1),
            failed,
            attempt("a2r", TURN2, REPLY2),
            attempt("a3", TURN3, ("Oslo 5C, Paris 9C.", [])),
        ],
        one_clock=True,
        placed=placed,
    )
    assert shape(eps) == [[["a1"]], [["a2", "a2r"], ["a3"]]]
    assert [ep.key for ep in eps] == ["r/~a1", "r/~a2"] and all(ep.reconstructed for ep in eps)


def test_different_reply_is_not_the_same_episode():
    eps = build_episodes(
        "r", [attempt("a1", TURN1, (None, [("get_weather", '{"city":"Rome"}')])), attempt("a2", TURN2, REPLY2)]
    )
    assert shape(eps) == [[["a1"]], [["a2"]]]


def test_a_reply_whose_arguments_did_not_parse_continues_however_the_harness_wrote_it_back():
    """dspy repairs the JSON a model broke before it writes the step into its next prompt: the
    request extends a1's by that step, and a1's reply could not be read whole."""
    broken = (None, [("get_weather", '{"city": "Oslo"]')])
    keys = conversation_keys(
        TURN1, tool_set="ts1", tool_names=["get_weather"], model="m", reply=broken, reply_unread=True
    )
    a1 = Attempt(
        id="a1",
        episode=None,
        item=None,
        category=None,
        condition="native",
        outcome="invalid_args",
        sub_kind=None,
        harness_saw_prose=False,
        state_hash=keys.state_hash,
        chain_hash=keys.chain_hash,
        parent_hashes=keys.parent_hashes,
        prior_hash=keys.prior_hash,
        prefix_links=keys.prefix_links,
        item_hash=keys.item_hash,
        call_signature=None,
        reply_keys=keys.reply_keys,
    )
    assert shape(build_episodes("r", [a1, attempt("a2", TURN2, REPLY2)])) == [[["a1"], ["a2"]]]
    # the same under another system prompt (dspy's extract step after its last step)
    wrap_up = [{"role": "system", "content": "Extract the answer."}, *TURN2[1:]]
    assert shape(build_episodes("r", [a1, attempt("a2", wrap_up, ("Oslo: 5C.", []))])) == [[["a1"], ["a2"]]]
    # a reply read whole is continued only by a request that carries it
    a1_read = attempt("a1", TURN1, (None, [("get_weather", '{"city": "Rome"}')]))
    assert shape(build_episodes("r", [a1_read, attempt("a2", wrap_up, ("Oslo: 5C.", []))])) == [[["a1"]], [["a2"]]]


def test_retries_after_failures_are_one_turn_outcome_of_the_last():
    eps = build_episodes(
        "r",
        [
            attempt("a1", TURN1, outcome="non_response", sub_kind="http_5xx"),
            attempt("a2", TURN1, outcome="non_response", sub_kind="timeout"),
            attempt("a3", TURN1, REPLY1),
            attempt("a4", TURN2, REPLY2),
        ],
    )
    assert shape(eps) == [[["a1", "a2", "a3"], ["a4"]]]
    assert eps[0].turns[0].result() == ("valid_call", None)


def test_every_attempt_failed_keeps_its_cause_with_the_attempt_count():
    """A harness retrying a refusal must not turn "refused" into a generic retry failure."""
    eps = build_episodes(
        "r",
        [
            attempt("a1", TURN1, outcome="non_response", sub_kind="http_5xx", episode="1"),
            attempt("a2", TURN1, outcome="non_response", sub_kind="http_5xx", episode="1"),
            attempt("b1", TURN1, outcome="non_response", sub_kind="refused", episode="2"),
        ],
    )
    assert [t.result() for ep in eps for t in ep.turns] == [("non_response", "http_5xx"), ("non_response", "refused")]
    assert [len(t.attempts) for ep in eps for t in ep.turns] == [2, 1]


def test_same_request_after_a_success_is_a_new_turn_or_a_repeat_episode():
    tagged = build_episodes("r", [attempt("a1", TURN1, REPLY1, episode="7"), attempt("a2", TURN1, REPLY1, episode="7")])
    assert shape(tagged) == [[["a1"], ["a2"]]]
    untagged = build_episodes("r", [attempt("a1", TURN1, REPLY1), attempt("a2", TURN1, REPLY1)])
    assert shape(untagged) == [[["a1"]], [["a2"]]]


def test_tagged_episodes_and_items():
    eps = build_episodes(
        "run1",
        [
            attempt("a1", TURN1, REPLY1, episode="3", item="simple_12"),
            attempt("b1", TURN1, REPLY1, episode="4", item="parallel-7", category="parallel_multiple"),
            attempt("a2", TURN2, REPLY2, episode="3", item="simple_12"),
        ],
    )
    assert shape(eps) == [[["a1"], ["a2"]], [["b1"]]]
    assert [(e.key, e.name, e.reconstructed, e.item_key, e.category) for e in eps] == [
        ("run1/3", "3", False, "simple_12", "simple"),
        ("run1/4", "4", False, "parallel-7", "parallel_multiple"),
    ]


def test_item_hash_depends_on_messages_and_offered_tools_not_on_ids():
    base = attempt("a", TURN2).item_hash
    assert attempt("b", TURN2).item_hash == base
    assert attempt("c", TURN2, tools=("get_weather", "get_time")).item_hash != base
    assert attempt("d", TURN1).item_hash != base


CATEGORIES = [
    ("simple_12", None, "simple"),
    ("live-multiple-3", None, "live"),
    ("parallel_multiple_3", None, "parallel"),
    ("42", None, None),
    ("h:abc_def", None, None),
    (None, None, None),
    ("simple_1", "irrelevance", "irrelevance"),
]


@pytest.mark.parametrize("item,tag,expected", CATEGORIES)
def test_category_of(item, tag, expected):
    assert category_of(item, tag) == expected


LOOPS = [
    (["x", "x", "x"], 2, "3 identical consecutive calls"),
    (["x", "x", None, "x"], 2, None),
    (["x", "y", "x", "y"], 4, None),
    ([None] * 12, 3, "12 turns, run median 3"),
    ([None] * 12, 5, None),
    ([None] * 9, 2, None),
]


@pytest.mark.parametrize("signatures,median,expected", LOOPS)
def test_loop_reason(signatures, median, expected):
    assert loop_reason(signatures, median) == expected


def test_looping_episode_flagged_in_build():
    looping = [
        attempt(
            f"l{i}",
            [SYS, USER] + [{"role": "user", "content": str(i)}],
            episode="L",
            calls=[("get_weather", {"city": "Oslo"})],
        )
        for i in range(4)
    ]
    normal = [attempt("n1", TURN1, episode="N", calls=[("get_weather", {"city": "Oslo"})])]
    eps = build_episodes("r", looping + normal)
    assert [(e.name, e.looping, e.loop_reason) for e in eps] == [
        ("L", True, "4 identical consecutive calls"),
        ("N", False, None),
    ]


@pytest.mark.parametrize("knob", ["_BATCH_ATTEMPTS", "_CHUNK_TURNS"])
def test_derive_in_batches_of_runs_writes_the_same_rows(tmp_path, monkeypatch, knob):
    """derive() reads and writes many runs per statement (batches of about _BATCH_ATTEMPTS
    attempts) and stages their rows in chunks (of about _CHUNK_TURNS turns): a batch per run, and
    a chunk per episode, derive exactly what one batch for every run does."""
    from toolproxy.analysis.episodes import derive as turns
    from toolproxy.analysis.lifecycle.ingest import ingest
    from toolproxy.analysis.store.connection import connect, default_db
    from toolproxy.testing.corpus import generate

    generate(tmp_path, 600, seed=5, segment_records=300)
    con = connect(default_db(tmp_path))
    ingest(con, tmp_path, workers=0)

    def derived():
        return {
            table: con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
            for table in ("turns", "episodes", "runs", "episode_keys")
        } | {
            "turn_ids": con.execute("SELECT id, turn_id FROM exchanges ORDER BY ALL").fetchall(),
            "call_turn_ids": con.execute("SELECT exchange_id, idx, turn_id FROM calls ORDER BY ALL").fetchall(),
        }

    runs = [r for (r,) in con.execute("SELECT DISTINCT run FROM exchanges").fetchall()]
    one_batch = derived()
    assert len(runs) > 2 and len(one_batch["turns"]) > 100 and all(t for _, t in one_batch["turn_ids"])
    assert len(one_batch["episode_keys"]) > 100
    monkeypatch.setattr(turns, knob, 1)
    con.execute("UPDATE exchanges SET turn_id = NULL")
    con.execute("UPDATE calls SET turn_id = NULL")
    for table in ("turns", "episodes", "episode_keys", "runs"):
        con.execute(f"DELETE FROM {table}")
    assert turns.derive(con, runs) == {"turns": len(one_batch["turns"]), "episodes": len(one_batch["episodes"])}
    assert derived() == one_batch


def copies(names=("A", "B", "C"), ids=True, answer_order=(2, 0, 1)):
    """Identical episodes in flight together: the same first request three times, answered with the
    same call under different ids (as a stack makes them up; `ids=False`: none), then each copy's
    second request in another order than the first ones went (whichever tool finished first)."""
    first = [attempt(f"{n}1", TURN1, REPLY1, ids=[n] if ids else ()) for n in names]
    return first + [
        attempt(f"{names[k]}2", second(names[k] if ids else "x"), ("Oslo is 5C.", [])) for k in answer_order
    ]


def second(cid):
    return TURN1 + [
        call_msg("get_weather", '{"city":"Oslo"}', cid),
        {"role": "tool", "tool_call_id": cid, "content": "5C"},
    ]


def test_identical_episodes_at_the_same_time_each_follow_their_own_reply():
    """inspect-ai's epochs, threads asking one question: the copies are told apart by their calls' ids."""
    assert shape(build_episodes("r", copies())) == [[["A1"], ["A2"]], [["B1"], ["B2"]], [["C1"], ["C2"]]]


def test_identical_episodes_nothing_tells_apart_are_each_continued_once():
    """Without ids (a harness that makes its own, calls in text...): which copy a second request
    continues cannot be known, but three copies stay three episodes of two turns."""
    eps = build_episodes("r", copies(ids=False))
    assert [len(ep.turns) for ep in eps] == [2, 2, 2]


def test_many_identical_episodes_are_each_continued_once_in_order():
    """A load test's copies, more than a key's list of turns holds before it becomes a queue: each
    second request continues the oldest copy still open, whichever way the key holds them."""
    names = [f"n{k:02d}-" for k in range(80)]
    eps = build_episodes("r", copies(names=names, answer_order=range(80), ids=False))
    assert [[t.attempts[0].id for t in ep.turns] for ep in eps] == [[f"{n}1", f"{n}2"] for n in names]


def test_the_same_step_sent_again_after_its_copy_continued_starts_an_episode():
    a1, b1, c1, c2, a2, b2 = copies()
    again = attempt("A2x", second("A"), ("Oslo is 5C.", []))
    assert shape(build_episodes("r", [a1, b1, a2, again])) == [[["A1"], ["A2"]], [["B1"]], [["A2x"]]]


def test_copies_come_out_the_same_whatever_order_several_clocks_put_them_in():
    import itertools

    attempts = copies(names=("A", "B"), answer_order=(1, 0))
    want = sorted(shape(build_episodes("r", attempts)))
    for order in itertools.permutations(attempts):
        assert sorted(shape(build_episodes("r", list(order)))) == want, [a.id for a in order]


NOTE = {"role": "system", "content": "Please return text or call a tool."}


def test_a_request_that_dropped_the_reply_before_it_continues_that_episode():
    """pydantic-ai drops an empty reply and resends the history plus a note of its own."""
    empty = attempt("a2", TURN2, outcome="non_response", sub_kind="empty")
    eps = build_episodes("r", [attempt("a1", TURN1, REPLY1), empty, attempt("a3", TURN2 + [NOTE], ("Oslo 5C.", []))])
    assert shape(eps) == [[["a1"], ["a2"], ["a3"]]]
    # the note in place of nothing: a request that only begins like another is not its retry
    assert shape(build_episodes("r", [attempt("b1", [SYS], ("Hi.", [])), attempt("b2", [SYS, USER], REPLY1)])) == [
        [["b1"]],
        [["b2"]],
    ]


def test_a_summary_under_another_system_prompt_belongs_to_the_episode_it_summarises():
    """smolagents at max_steps, dspy's extract step: a new system prompt, the same history."""
    summary = (
        [{"role": "system", "content": "Summarise what the agent found."}]
        + TURN3[1:]
        + [{"role": "assistant", "content": "Oslo 5C, Paris 9C."}, {"role": "user", "content": "Answer the task now."}]
    )
    eps = build_episodes(
        "r",
        [
            attempt("a1", TURN1, REPLY1),
            attempt("a2", TURN2, REPLY2),
            attempt("a3", TURN3, ("Oslo 5C, Paris 9C.", [])),
            attempt("s", summary, ("Done.", []), tools=()),
        ],
    )
    assert shape(eps) == [[["a1"], ["a2"], ["a3"], ["s"]]]
    # a request that extends the full conversation is preferred to one that only shares its tail
    other = [{"role": "system", "content": "Another agent."}] + TURN2[1:]
    eps = build_episodes("r", [attempt("a1", TURN1, REPLY1), attempt("o", other, REPLY2), attempt("a2", TURN2, REPLY2)])
    assert shape(eps) == [[["a1"], ["o"]], [["a2"]]]


REJECTS = [
    (
        [
            *TURN1,
            {"role": "assistant", "content": "Action:"},
            {"role": "user", "content": "Error:\nError while parsing tool call from model output: no JSON blob."},
        ],
        True,
    ),
    (
        [
            *TURN1,
            {"role": "assistant", "content": "x"},
            {"role": "tool", "content": "Invalid Format: Missing 'Action:' after 'Thought:'"},
        ],
        True,
    ),
    ([*TURN1, {"role": "assistant", "content": "x"}, {"role": "user", "content": "Observation: sunny"}], False),
    # the words before the last reply are history, not a verdict on it
    (
        [
            {"role": "user", "content": "Error while parsing tool call from model output"},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "thanks"},
        ],
        False,
    ),
    ([{"role": "user", "content": "Error while parsing tool call from model output"}], False),
]


@pytest.mark.parametrize("messages,rejects", REJECTS)
def test_a_request_says_when_the_harness_rejected_the_reply_before_it(messages, rejects):
    assert conversation_keys(messages, tool_set=None, tool_names=[], model="m", reply=None).rejects is rejects


def _timed(a: Attempt, started: float, ended: float) -> Attempt:
    a.started, a.ended = started, ended
    return a


def test_a_retry_comes_after_the_attempt_it_repeats_failed():
    """The same request sent again once its attempt failed is a retry of it; the same request sent
    while that attempt was still running is another conversation's (identical tasks at once)."""

    def failed(aid, started):
        return _timed(attempt(aid, TURN1, outcome="non_response", sub_kind="http_5xx"), started, started + 5)

    later = _timed(attempt("a2", TURN1, REPLY1), 6.0, 7.0)
    assert shape(build_episodes("r", [failed("a1", 0.0), later], one_clock=True)) == [[["a1", "a2"]]]
    meanwhile = _timed(attempt("b1", TURN1, REPLY1), 2.0, 3.0)
    assert shape(build_episodes("r", [failed("a1", 0.0), meanwhile], one_clock=True)) == [[["a1"]], [["b1"]]]


def test_a_retry_never_crosses_the_call_ids_that_tell_identical_conversations_apart():
    """Two identical conversations whose last requests both failed: each later request repeats its
    own (its history carries its own call ids), not the other's, whatever the order."""

    def turn2(cid):
        return TURN1 + [
            call_msg("get_weather", '{"city":"Oslo"}', cid),
            {"role": "tool", "tool_call_id": cid, "content": "5C"},
        ]

    attempts = [
        _timed(attempt("a1", TURN1, REPLY1, ids=["x"]), 0, 1),
        _timed(attempt("b1", TURN1, REPLY1, ids=["y"]), 0, 1),
        _timed(attempt("a2", turn2("x"), outcome="non_response", sub_kind="empty"), 2, 3),
        _timed(attempt("b2", turn2("y"), outcome="non_response", sub_kind="empty"), 2, 3),
        _timed(attempt("b3", turn2("y"), REPLY2), 4, 5),
    ]
    assert shape(build_episodes("r", attempts, one_clock=True)) == [[["a1"], ["a2"]], [["b1"], ["b2", "b3"]]]


def test_a_wrap_up_that_names_no_turn_goes_on_with_its_conversations_one_episode():
    """A harness wrapping up under another system prompt, its calls rewritten in a form no key
    follows, goes on with the episode of its conversation (its first user message) that ran alone
    before it; two such episodes at once leave it unplaced, and so do several clocks (replicas'
    stamps cannot tell whether the episodes overlapped)."""
    wrap = [
        {"role": "system", "content": "Summarize."},
        USER,
        {"role": "assistant", "content": "Called get_weather"},
        {"role": "user", "content": "5C"},
    ]

    def threaded(a: Attempt, messages, started: float) -> Attempt:
        a.thread = conversation_keys(messages, tool_set=None, tool_names=[], model="m", reply=None).thread
        return _timed(a, started, started + 1)

    alone = [
        threaded(attempt("a1", TURN1, REPLY1), TURN1, 0),
        threaded(attempt("w", wrap, ("5C.", []), tools=()), wrap, 5),
    ]
    assert shape(build_episodes("r", alone, one_clock=True)) == [[["a1"], ["w"]]]
    assert shape(build_episodes("r", alone, one_clock=False)) == [[["a1"]], [["w"]]]
    together = [
        threaded(attempt("a1", TURN1, REPLY1), TURN1, 0),
        threaded(attempt("b1", TURN1, REPLY1), TURN1, 0.5),
        threaded(attempt("w", wrap, ("5C.", []), tools=()), wrap, 5),
    ]
    assert shape(build_episodes("r", together, one_clock=True)) == [[["a1"]], [["b1"]], [["w"]]]
