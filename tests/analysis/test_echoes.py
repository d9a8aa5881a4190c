"""Episodes of harnesses that rewrite history: calls re-serialised as text still chain.

Unit tables for analysis.classify.echoes, episode building on smolagents-shaped conversations, and the
real smolagents traffic in tests/data/smolagents run through `toolproxy analyze`."""

from __future__ import annotations

from pathlib import Path

import captured
import pytest
from captured import by_episode

from toolproxy.analysis.classify.echoes import MAX_TEXT, echoed_calls
from toolproxy.analysis.classify.keys import call_signature, conversation_keys
from toolproxy.analysis.episodes.build import build_episodes
from toolproxy.analysis.episodes.model import Attempt

CAPTURED = Path(__file__).resolve().parent.parent / "data" / "smolagents"
# Both captures: three tasks, the second with two weather calls; smolagents ends each with final_answer.
EXPECTED_EPISODES = [
    [(0, 2, "get_weather", "Paris"), (1, 4, "final_answer", None)],
    [(0, 2, "get_weather", "Paris"), (1, 4, "get_weather", "Oslo"), (2, 6, "final_answer", None)],
    [(0, 2, "get_weather", "Oslo"), (1, 4, "final_answer", None)],
]
TOOLS = ("get_weather", "final_answer")
PARIS = {"city": "Paris"}

GW = ("get_weather", PARIS)
SMOL = (
    "Calling tools:\n[{'id': 'c', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': "
    "'Paris'}}}]"
)
HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# text -> every reading of the calls it echoes
ECHOES = [
    # smolagents ToolCallingAgent: a Python repr after a label
    (SMOL, [[GW]]),
    # the same list as JSON (a harness that json.dumps its history): both readings agree, kept once
    (
        'Calling tools:\n[{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": '
        '"Paris"}}}]',
        [[GW]],
    ),
    # prose beside the call, merged into one message; an apostrophe in the prose
    ("Let me look that up, it's quick.\n" + SMOL, [[GW]]),
    # two calls in one echo, in order; True/None are Python literals
    (
        "[{'name': 'get_weather', 'arguments': {'city': 'Oslo', 'metric': True}}, "
        "{'name': 'final_answer', 'arguments': {'answer': None}}]",
        [[("get_weather", {"city": "Oslo", "metric": True}), ("final_answer", {"answer": None})]],
    ),
    # the model-side formats toolproxy parses anyway (a harness resending the raw text call)
    (HERMES, [[GW]]),
    # smolagents on a stack that left the call in the text: the model's text, then the repr;
    # read as a Hermes call it is one call, read as literals two
    (HERMES + "\n" + SMOL, [[GW], [GW, GW]]),
    # other argument spellings
    ("{'name': 'get_weather', 'input': {'city': 'Paris'}}", [[GW]]),
    ("{'tool_calls': [{'name': 'get_weather', 'parameters': {'city': 'Paris'}}]}", [[GW]]),
    # names that are not offered, prose, and broken input echo nothing
    ("Calling tools:\n[{'function': {'name': 'delete_all', 'arguments': {}}}]", []),
    ("The weather in Paris is {sunny}.", []),
    ("get_weather is what I would use [but I won't", []),
    ("get_weather " + "[" * 5000, []),
    ("get_weather " + "[" * 200 + "]" * 200, []),
    ("", []),
    ("get_weather " + "x" * MAX_TEXT, []),
]


@pytest.mark.parametrize("text,expected", ECHOES)
def test_echoed_calls(text, expected):
    assert echoed_calls(text, TOOLS) == expected


@pytest.mark.parametrize("text,expected", ECHOES)
def test_echoed_calls_read_the_names_as_a_set_and_after_classify_parsed_the_text(text, expected, monkeypatch):
    """Echoes share classify's memo of parsed texts (keyed by the names as given): a text classify
    parsed is answered from the memo, and the order the names come in changes nothing."""
    from toolproxy.analysis.classify import textparse
    from toolproxy.analysis.classify.attempt import classify
    from toolproxy.wire import Reply

    class Memo(dict):
        hits = 0

        def get(self, key, default=None):
            Memo.hits += key in self
            return super().get(key, default)

    monkeypatch.setattr(textparse, "_PARSES", Memo())
    reply = Reply()
    reply.content = text
    classify(reply, status=200, error_kind=None, tools=None, tool_names=list(TOOLS))
    remembered = len(textparse._PARSES)
    assert echoed_calls(text, list(TOOLS)) == expected
    if remembered and any(name in text for name in TOOLS):  # echoes parses only such texts
        assert Memo.hits == 1
    assert echoed_calls(text, list(reversed(TOOLS))) == expected


SYS = {"role": "system", "content": [{"type": "text", "text": "You solve tasks with tool calls."}]}


def task(text):
    return {"role": "user", "content": [{"type": "text", "text": f"New task:\n{text}"}]}


def echo(name, args, cid, prose=""):
    call = {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
    return {"role": "assistant", "content": [{"type": "text", "text": f"{prose}Calling tools:\n{[call]!r}"}]}


def observation(text):
    return {"role": "user", "content": [{"type": "text", "text": f"Observation:\n{text}"}]}


def attempt(aid, messages, calls, *, tools=TOOLS, tool_set="ts1", content=None, empty=False):
    """An attempt whose reply made `calls` natively (beside `content`), as the proxy saw it; or,
    `empty`, a reply that came back with nothing (a non-response: no chain hash)."""
    reply = None if empty else (content, [(n, a) for n, a in calls])
    keys = conversation_keys(messages, tool_set=tool_set, tool_names=list(tools), model="m", reply=reply)
    return Attempt(
        id=aid,
        episode=None,
        item=None,
        category=None,
        condition="native",
        outcome="non_response" if empty else "valid_call",
        sub_kind="empty" if empty else None,
        harness_saw_prose=False,
        state_hash=keys.state_hash,
        chain_hash=keys.chain_hash,
        parent_hashes=keys.parent_hashes,
        prior_hash=keys.prior_hash,
        prefix_links=keys.prefix_links,
        item_hash=keys.item_hash,
        call_signature=call_signature(calls),
    )


def shape(episodes):
    return [[t.final.id for t in ep.turns] for ep in episodes]


T1 = [SYS, task("Weather in Paris?")]
T2 = T1 + [echo("get_weather", PARIS, "call_1"), observation("sunny")]
T3 = T2 + [echo("get_weather", {"city": "Oslo"}, "call_2"), observation("rain")]


def test_rewritten_history_is_one_episode():
    eps = build_episodes(
        "r",
        [
            attempt("a1", T1, [("get_weather", '{"city": "Paris"}')]),
            attempt("a2", T2, [("get_weather", '{"city":"Oslo"}')]),
            attempt("a3", T3, [("final_answer", {"answer": "Paris"})]),
        ],
    )
    assert shape(eps) == [["a1", "a2", "a3"]]
    assert eps[0].reconstructed


def test_echo_must_repeat_the_call_the_reply_made():
    # The harness says it called Oslo, but the reply asked for Paris: not this conversation.
    other = T1 + [echo("get_weather", {"city": "Oslo"}, "call_1"), observation("rain")]
    eps = build_episodes("r", [attempt("a1", T1, [("get_weather", PARIS)]), attempt("a2", other, [])])
    assert shape(eps) == [["a1"], ["a2"]]


def test_echo_must_follow_the_same_request():
    # Same echoed call, but after a different task: a different conversation.
    other = [SYS, task("Weather in Rome?"), echo("get_weather", PARIS, "c"), observation("sunny")]
    eps = build_episodes("r", [attempt("a1", T1, [("get_weather", PARIS)]), attempt("a2", other, [])])
    assert shape(eps) == [["a1"], ["a2"]]


def test_echo_must_offer_the_same_tools():
    eps = build_episodes("r", [attempt("a1", T1, [("get_weather", PARIS)]), attempt("a2", T2, [], tool_set="ts2")])
    assert shape(eps) == [["a1"], ["a2"]]


def test_two_runs_of_one_task_interleaved_follow_their_own_calls():
    # Two agents start the same task at once; each continuation echoes its own first call.
    b2 = T1 + [echo("get_weather", {"city": "paris"}, "call_9"), observation("sunny")]
    eps = build_episodes(
        "r",
        [
            attempt("a1", T1, [("get_weather", PARIS)]),
            attempt("b1", T1, [("get_weather", {"city": "paris"})]),
            attempt("a2", T2, [("final_answer", {"answer": "A"})]),
            attempt("b2", b2, [("final_answer", {"answer": "B"})]),
        ],
    )
    assert sorted(shape(eps)) == [["a1", "a2"], ["b1", "b2"]]


def test_prose_and_echo_split_over_two_assistant_messages():
    # A harness that keeps the model's prose and its call list as separate assistant messages.
    prose = {"role": "assistant", "content": "Let me check."}
    t2 = T1 + [prose, echo("get_weather", PARIS, "c1"), observation("sunny")]
    eps = build_episodes("r", [attempt("a1", T1, [("get_weather", PARIS)]), attempt("a2", t2, [])])
    assert shape(eps) == [["a1", "a2"]]


def analyzed(tmp_path, capture: str, expect_summary: str):
    return captured.analyzed(tmp_path, CAPTURED / capture / "segments", expect_summary)


@pytest.mark.parametrize("stack,surface", [("openai", "native"), ("sglang", "text")])
def test_captured_smolagents_traffic_rebuilds_its_episodes(tmp_path, stack, surface):
    """openai: calls in tool_calls. sglang without a tool parser: calls left in the text, which
    smolagents parsed and ran itself, then resent beside its own re-serialisation."""
    con = analyzed(tmp_path, stack, "turns: 7; episodes: 3")
    try:
        rows = con.execute("""
            SELECT t.episode_key, t.turn_index, e.n_messages, c.name, json_extract_string(c.arguments, '$.city')
            FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id JOIN calls c ON c.exchange_id = e.id
            ORDER BY e.started_at""").fetchall()
        reconstructed, surfaces = con.execute(
            "SELECT bool_and(reconstructed), list(DISTINCT surface) FROM episodes JOIN turns USING (episode_key)"
        ).fetchone()
        # openai: every call reached the harness in tool_calls. sglang: calls left in the text count
        # as delivered when smolagents parsed and ran them itself, which only the rebuilt episode
        # shows (its next request carries the result); the final_answer call that ends an episode
        # has no next request, so nothing on the wire proves it was acted on.
        delivered = con.execute(
            "SELECT list(t.role ORDER BY e.started_at), list(t.delivered ORDER BY e.started_at) "
            "FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id"
        ).fetchone()
    finally:
        con.close()
    assert by_episode(rows) == EXPECTED_EPISODES
    assert reconstructed and surfaces == [surface]
    last = [False, True, False, False, True, False, True]  # request order: episodes of 2, 3, 2 turns
    # Each episode ends with smolagents' final_answer call after a tool result: its answer.
    roles = ["answer" if x else "call" for x in last]
    assert delivered == (roles, [True] * 7 if stack == "openai" else [not x for x in last])


def test_real_llamacpp_smolagents_traffic_rebuilds_its_episodes(tmp_path):
    """Real Qwen2.5-Coder-0.5B on llama.cpp: calls left in the text that smolagents parsed, an empty
    reply it wrote into its history, a hallucinated tool; two episodes of three turns each."""
    con = analyzed(tmp_path, "llamacpp", "turns: 6; episodes: 2")
    try:
        rows = con.execute("""
            SELECT t.episode_key, t.turn_index, t.outcome, t.sub_kind, e.n_messages, t.delivered
            FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id ORDER BY e.started_at""").fetchall()
    finally:
        con.close()
    # The first call stayed in the text, but smolagents parsed and ran it (the rebuilt episode's next
    # request carries the result): delivered. The empty reply is smolagents' own stop string
    # (`Observation:`, 3 completion tokens), not text the server ate.
    assert by_episode(rows) == [
        [
            (0, "valid_call", None, 2, True),
            (1, "non_response", "stop_string", 4, False),
            (2, "invalid_args", None, 6, False),
        ],
        [
            (0, "hallucinated_call", None, 2, False),
            (1, "hallucinated_call", None, 4, False),
            (2, "non_response", "client_gave_up", 6, False),
        ],
    ]


def test_an_empty_reply_written_into_the_history_chains():
    empty = {"role": "assistant", "content": [{"type": "text", "text": ""}]}
    error = {"role": "user", "content": "Error: no JSON blob. Now let's retry."}
    a1 = attempt("a1", T1, [], empty=True)
    a2 = attempt("a2", T1 + [empty, error], [("get_weather", PARIS)])
    assert shape(build_episodes("r", [a1, a2])) == [["a1", "a2"]]
    # an empty assistant message never continues a turn that answered something
    a1_prose = attempt("a1", T1, [], content="It is sunny.")
    assert shape(build_episodes("r", [a1_prose, a2])) == [["a1"], ["a2"]]


def test_structured_call_resent_without_its_prose_still_chains():
    # The reply said "Let me check." beside its call; the harness resends only the call, and the
    # result as a user message: exact prefix chaining fails, the echo of the call does not.
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Weather in Paris?"}]
    resent = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
        ],
    }
    later = first + [resent, {"role": "user", "content": "Result: sunny"}]
    a1 = attempt("a1", first, [("get_weather", '{"city": "Paris"}')], content="Let me check.")
    a2 = attempt("a2", later, [])
    assert a1.chain_hash not in a2.parent_hashes
    assert shape(build_episodes("r", [a1, a2])) == [["a1", "a2"]]
