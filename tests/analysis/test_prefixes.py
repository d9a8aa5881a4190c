"""keys.Prefixes: resuming an earlier request's walk gives the keys a fresh walk gives, on
hand-made cases and on every record of the real-harness captures and of a generated long-episode
corpus, and does resume (the saving is real)."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
from captured import analyzed

from toolproxy.analysis.classify.keys import Prefixes, conversation_keys, link_map, parent_walk
from toolproxy.analysis.classify.record import analyze_record
from toolproxy.record.segments import SEGMENT_DIR, list_segments, read_segment
from toolproxy.testing.corpus import episode, interleaved

DATA = Path(__file__).resolve().parents[1] / "data"

SYSTEM = {"role": "system", "content": "You are a careful agent."}
TASK = {"role": "user", "content": "Weather in Paris and Oslo?"}


def _call(i: int, args) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}],
    }


def _result(i: int) -> dict:
    return {"role": "tool", "tool_call_id": f"c{i}", "content": f"{i} degrees"}


def _keys(messages, prefixes=None, reply=("done", [])):
    return conversation_keys(
        messages, tool_set="ts", tool_names=["get_weather"], model="m", reply=reply, reply_ids=["r1"], prefixes=prefixes
    )


def _conversation(turns: int, args=lambda i: {"city": f"c{i}", "n": 1}) -> list[list]:
    """The message list of each request of a tool loop: every request resends the one before it,
    its reply and the tool's result."""
    messages, out = [SYSTEM, TASK], []
    for i in range(turns):
        out.append(list(messages))
        messages += [_call(i, args(i)), _result(i)]
    return out


# Each case: the requests one Prefixes sees, in order. Every request's keys must equal a fresh walk's.
CASES = {
    "a tool loop": _conversation(6),
    "a retry sends the same messages again": [m for req in _conversation(4) for m in (req, req)],
    "the harness dropped a reply and resent the request before it": (
        lambda c: [c[0], c[1], c[2], c[1] + [{"role": "user", "content": "Please call a tool."}], c[3]]
    )(_conversation(4)),
    "two conversations with the same head, interleaved": [
        req for pair in zip(_conversation(4), _conversation(4, lambda i: {"city": f"other{i}"})) for req in pair
    ],
    # equal in Python (1 == 1.0 == True), different in the canonical form: no walk is shared
    "arguments 1, then 1.0, then true": [
        _conversation(3, lambda i: {"n": 1})[2],
        _conversation(4, lambda i: {"n": 1.0})[3],
        _conversation(4, lambda i: {"n": True})[3],
        _conversation(4, lambda i: {"n": 1})[3],
    ],
    "arguments as strings that parse to the same JSON": [
        _conversation(3, lambda i: '{"n": 1}')[2],
        _conversation(4, lambda i: '{ "n" : 1 }')[3],
    ],
    "messages that are not objects": [[SYSTEM, "stray", TASK], [SYSTEM, "stray", TASK, _call(0, "{}"), 7]],
    "one message, then none": [[SYSTEM], [], [SYSTEM]],
    # what a request writes as a role or a part type may be any JSON, a list too (not hashable)
    "roles and part types that are not strings": [
        [{"role": [1], "content": "x"}, {"role": {"a": 1}, "content": [{"type": ["tool_result"], "text": "t"}]}],
        [
            {"role": [1], "content": "x"},
            {"role": {"a": 1}, "content": [{"type": ["tool_result"], "text": "t"}]},
            {"role": ["assistant"], "content": "y"},
            {"role": "tool", "content": [{"type": {"x": 1}}]},
        ],
    ],
    "the system prompt swapped at the end": (lambda c: c + [[{"role": "system", "content": "Summarise."}, *c[-1][1:]]])(
        _conversation(4)
    ),
    "prose replies and text observations": [
        [SYSTEM, TASK],
        [
            SYSTEM,
            TASK,
            {"role": "assistant", "content": "Thought: look"},
            {"role": "user", "content": "Observation: 3 degrees"},
        ],
        [
            SYSTEM,
            TASK,
            {"role": "assistant", "content": "Thought: look"},
            {"role": "user", "content": "Observation: 3 degrees"},
            {"role": "assistant", "content": "Thought: done"},
            {"role": "assistant", "content": "more"},
        ],
    ],
}


def _walked(keys, links) -> list[str]:
    return list(parent_walk(keys.parent_hashes, keys.prior_hash, links))


@pytest.mark.parametrize("requests", CASES.values(), ids=CASES.keys())
def test_a_resumed_walk_gives_the_keys_of_a_fresh_one(requests):
    """Every key, and the parents walked back along the links the requests stored together give."""
    prefixes = Prefixes()
    stored = []
    for messages in requests:
        resumed, fresh = _keys(messages, prefixes), _keys(messages)
        assert resumed._replace(prefix_links=[]) == fresh._replace(prefix_links=[])
        assert set(resumed.prefix_links) <= set(fresh.prefix_links)
        stored.append(resumed.prefix_links)
        assert _walked(resumed, link_map(stored)) == _walked(fresh, link_map([fresh.prefix_links]))


def test_the_walk_names_every_earlier_assistant_message_longest_first():
    """parent_walk gives what parent_hashes held before storage step 9: after the stored keys, the
    rolling hash after each earlier assistant message, longest first; a tool loop's requests
    store those links once between them, not once per request."""
    requests = _conversation(8)
    prefixes, stored = Prefixes(), 0
    for t, messages in enumerate(requests):
        keys = _keys(messages, prefixes)
        stored += len(keys.prefix_links) // 2
        walked = _walked(keys, link_map([_keys(messages).prefix_links]))
        assert walked[: len(keys.parent_hashes)] == keys.parent_hashes
        earlier = walked[len(keys.parent_hashes) :]
        assert len(earlier) == max(t - 1, 0) and len(set(earlier)) == len(earlier)
        # each is the chain hash of the turn that wrote that assistant message, longest first
        chains = [
            _keys(requests[k], reply=(None, [("get_weather", {"city": f"c{k}", "n": 1})])).chain_hash
            for k in range(t - 1)
        ]
        assert earlier == chains[::-1]
    assert stored == len(requests) - 2


def test_a_request_resumes_the_walk_of_the_one_before_it():
    first, second, third = _conversation(3)
    prefixes = Prefixes()
    _keys(first, prefixes)
    _keys(second, prefixes)
    _, state, covered = prefixes.resume(third)
    assert state is not None and covered == len(second)
    _, state, covered = prefixes.resume([SYSTEM, TASK, _call(0, {"city": "elsewhere"})])
    assert state is not None and covered == len(first)  # only the part it shares
    _, state, covered = prefixes.resume(_conversation(3, lambda i: {"n": 1.0})[2])
    assert state is not None and covered == len(first)


def test_the_budget_bounds_what_is_kept():
    prefixes = Prefixes(budget=4000)
    rnd = random.Random(3)
    for n in range(200):
        task = {"role": "user", "content": f"task {n} " + "x" * rnd.randrange(10, 400)}
        messages = [SYSTEM, task]
        for i in range(3):
            _keys(list(messages), prefixes)
            messages += [_call(i, {"i": i}), _result(i)]
        assert 0 < prefixes.size <= 4000
        assert prefixes.size == sum(len(h[1]) + sum(len(b) for b, _, _ in kept) for h, kept in prefixes.heads.items())
        assert all(len(kept) <= Prefixes.PER_HEAD for kept in prefixes.heads.values())
    assert len(prefixes.heads) < 200


class _Counted(Prefixes):
    """The real cache, counting the requests it resumed (and the messages that saved walking)."""

    def __init__(self) -> None:
        super().__init__()
        self.resumed = self.saved = 0

    def resume(self, messages, scope=None):
        found, state, covered = super().resume(messages, scope)
        self.resumed += state is not None
        self.saved += covered
        return found, state, covered


def _row_walk(row: dict, links: dict) -> list[str] | None:
    return None if row["parent_hashes"] is None else list(parent_walk(row["parent_hashes"], row["prior_hash"], links))


def _same_rows(records) -> _Counted:
    """Each record's row with the cache is its row without one, but for prefix_links; and the
    parents walked along the links the run's rows store together are the ones a row alone gives."""
    prefixes = _Counted()
    stored: dict = {}
    for segment, offset, rec in records:
        row = analyze_record(rec, segment, offset, prefixes).exchange
        alone = analyze_record(rec, segment, offset).exchange
        assert {**row, "prefix_links": None} == {**alone, "prefix_links": None}, rec.get("id")
        stored.setdefault((row["run"], row["episode"] is None), []).append(row["prefix_links"])
        assert _row_walk(row, link_map(stored[row["run"], row["episode"] is None])) == _row_walk(
            alone, link_map([alone["prefix_links"]])
        ), rec.get("id")
    return prefixes


def test_every_captured_record_gets_the_same_row():
    dirs = sorted({seg.parent.parent for seg in DATA.rglob("segments/*.jsonl")})
    records = [
        (seg.name, line.offset, line.record)
        for data in dirs
        for seg in list_segments(data)
        for line in read_segment(seg)
        if line.record is not None and line.record.get("kind", "exchange") == "exchange"
    ]
    assert len(dirs) >= 19 and len(records) > 100
    assert _same_rows(records).resumed > len(records) / 2


def test_a_long_interleaved_corpus_gets_the_same_rows_and_resumes():
    rnd = random.Random(5)
    records = interleaved([episode(rnd, n, turns=30, growth=400, tagged=False) for n in range(8)])
    prefixes = _same_rows(("s", 0, orjson.loads(orjson.dumps(rec))) for rec in records)
    # every request after an episode's first resumes the one before it: 2 + 2 (t - 1) messages of 2 + 2 t
    assert prefixes.resumed == 8 * 29
    assert prefixes.saved == 8 * sum(2 + 2 * (t - 1) for t in range(1, 30))


def _analyzed(tmp_path: Path, records):
    """`toolproxy analyze` over one segment of these records (captured.analyzed)."""
    seg = tmp_path / "recorded" / SEGMENT_DIR
    seg.mkdir(parents=True)
    with open(seg / "20261129T140000-1-0001.jsonl", "wb") as f:
        for rec in records:
            f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
    return analyzed(tmp_path, seg)


def test_stored_keys_grow_with_an_episode_not_its_square(tmp_path):
    """Untagged episodes of 20 and of 80 turns, analysed: the keys stored per exchange stay flat
    (they were one per earlier assistant message), and each episode is rebuilt whole."""
    stored = {}
    for turns in (20, 80):
        (tmp_path / str(turns)).mkdir()
        with _analyzed(
            tmp_path / str(turns), episode(random.Random(turns), 1, turns=turns, growth=150, tagged=False)
        ) as con:
            assert con.execute("SELECT n_turns FROM episodes").fetchall() == [(turns,)]
            stored[turns] = con.execute(
                "SELECT sum(len(parent_hashes) + coalesce(len(prefix_links), 0)) FROM exchanges"
            ).fetchone()[0]
    # 4x the turns: 4x the keys give or take one request's; the square would be 16x
    assert stored[80] <= 4.2 * stored[20], stored


def test_requests_after_records_set_aside_still_walk_back_past_them(tmp_path):
    """Two consecutive turns set aside (a status no column holds): the turn after them continues the
    one before them through the links back, which the set-aside rows cannot have carried."""
    records = episode(random.Random(9), 1, turns=12, growth=150, tagged=False)
    for rec in records[5:7]:
        rec.status = 2**40
    with _analyzed(tmp_path, records) as con:
        assert con.execute("SELECT count(*) FROM ingest_issues WHERE kind = 'bad_type'").fetchone()[0] == 2
        assert con.execute("SELECT n_turns FROM episodes").fetchall() == [(10,)]
