"""Threads (keys.thread_key): no attempt names a key that an attempt of another thread gives, so
derive groups a large run a batch of threads at a time and gets, row for row, what grouping it
whole gives: on the real-harness captures and on generated corpora, tagged, untagged and daily."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import orjson
import pytest

from toolproxy.analysis.classify.keys import conversation_keys, link_map, parent_walk, request_key, thread_key
from toolproxy.analysis.classify.record import analyze_record
from toolproxy.analysis.episodes import derive
from toolproxy.analysis.episodes.model import attempt_of
from toolproxy.analysis.episodes.order import chain_keys
from toolproxy.analysis.lifecycle.ingest import ingest
from toolproxy.analysis.store.connection import connect, default_db
from toolproxy.record.segments import SEGMENT_DIR, list_segments, read_segment
from toolproxy.testing.corpus import episode, generate, generate_long, interleaved

DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURES = sorted({seg.parent.parent for seg in DATA.rglob("segments/*.jsonl")})

SYSTEM = {"role": "system", "content": "You are a careful agent."}


@pytest.mark.parametrize(
    "messages, same_as",
    [
        ([SYSTEM, {"role": "user", "content": "task"}], [{"role": "user", "content": "task"}]),
        (
            [{"role": "developer", "content": "x"}, {"role": "user", "content": " task "}],
            [{"role": "user", "content": "task"}],
        ),
        # non-objects are not in the tail hash, so not in the thread either
        (
            [SYSTEM, "stray", {"role": "user", "content": "task"}, {"role": "assistant", "content": "a"}],
            [{"role": "user", "content": "task"}],
        ),
    ],
)
def test_the_thread_is_the_first_message_after_the_system_ones(messages, same_as):
    assert thread_key(messages) == thread_key(same_as) is not None


def test_a_role_that_is_not_a_string_is_not_a_system_one():
    assert thread_key([SYSTEM, {"role": ["system"], "content": "x"}]) == thread_key(
        [{"role": ["system"], "content": "x"}]
    )


@pytest.mark.parametrize("messages", [[], [SYSTEM], ["stray", SYSTEM]])
def test_a_conversation_of_system_messages_only_has_no_thread(messages):
    assert thread_key(messages) is None


def test_the_thread_is_in_the_keys():
    messages = [SYSTEM, {"role": "user", "content": "task"}]
    keys = conversation_keys(messages, tool_set=None, tool_names=[], model="m", reply=("hi", []))
    assert keys.thread == thread_key(messages)


def _captured_rows() -> list[dict]:
    return [
        analyze_record(line.record, seg.name, line.offset).exchange
        for data in CAPTURES
        for seg in list_segments(data)
        for line in read_segment(seg)
        if line.record is not None and line.record.get("kind", "exchange") == "exchange"
    ]


def test_no_captured_attempt_names_a_key_of_another_thread():
    """What makes threads apart exact: every key an attempt may continue or retry by (its walked
    parents and its request key) that another attempt of its run gives, that attempt gives in the
    same thread."""
    rows = [r for r in _captured_rows() if r["is_attempt"] and r["episode"] is None and r["state_hash"]]
    assert len(CAPTURES) >= 19 and len(rows) > 50
    links = link_map(r["prefix_links"] or () for r in rows)
    givers: dict[tuple, set] = {}
    for r in rows:
        for key in chain_keys(attempt_of(r)):
            givers.setdefault((r["run"], key), set()).add(r["thread"])
    named = 0
    for r in rows:
        for key in [*parent_walk(r["parent_hashes"] or (), r["prior_hash"], links), request_key(r["state_hash"])]:
            threads = givers.get((r["run"], key))
            if threads is not None:
                named += 1
                assert threads == {r["thread"]}, (r["id"], threads, r["thread"])
    assert named > len(rows) / 2  # the captures do chain: the check is not vacuous
    assert all(r["thread"] for r in rows)


def _tables(con) -> dict:
    return {
        table: con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
        for table in ("turns", "episodes", "episode_keys", "runs")
    } | {"turn_ids": con.execute("SELECT id, turn_id FROM exchanges ORDER BY ALL").fetchall()}


def _apart_equals_whole(data: Path, monkeypatch) -> int:
    """Ingest `data` (grouping its runs whole), group them again a thread per batch, compare;
    returns how many runs went in parts."""
    con = connect(default_db(data))
    ingest(con, data, workers=0)
    whole = _tables(con)
    runs = sorted(r for (r,) in con.execute("SELECT DISTINCT run FROM exchanges WHERE run IS NOT NULL").fetchall())
    sizes = derive._run_sizes(con, runs)
    monkeypatch.setattr(derive, "_BATCH_ATTEMPTS", 1)
    split = {run for _, parts, _ in derive._batches(con, runs, sizes) for run, _ in parts}
    derive.derive(con, runs)
    assert _tables(con) == whole
    monkeypatch.undo()
    con.close()
    return len(split)


def test_every_capture_grouped_a_thread_at_a_time_is_grouped_as_whole(tmp_path, monkeypatch):
    split = 0
    for n, capture in enumerate(CAPTURES):
        data = tmp_path / str(n)
        shutil.copytree(capture / "segments", data / "segments")
        split += _apart_equals_whole(data, monkeypatch)
    assert split >= len(CAPTURES) / 2


def _long_among_short(data: Path, tagged: bool) -> None:
    """Five 2-turn episodes and a 12-turn one: it loops by length against the run's median (2), not
    against its own (12), which is all a batch holding only its thread sees."""
    rnd = random.Random(2)
    records = interleaved([episode(rnd, n, 12 if n == 5 else 2, 150, tagged) for n in range(6)])
    (data / SEGMENT_DIR).mkdir(parents=True)
    with open(data / SEGMENT_DIR / "20261129T120000-1-0001.jsonl", "wb") as f:
        for rec in records:
            f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))


@pytest.mark.parametrize(
    "make",
    [
        lambda d: generate(d, 800, seed=3, segment_records=200),  # several stacks, retries, one untagged run
        lambda d: generate_long(d, 1500, seed=4, concurrent=8, tagged=False),  # untagged, interleaved
        lambda d: generate_long(d, 1500, seed=6, concurrent=8),  # tagged
        lambda d: generate_long(d, 1500, seed=8, concurrent=4, tagged=False, days=5),  # untagged, a run per day
        lambda d: _long_among_short(d, tagged=True),
        lambda d: _long_among_short(d, tagged=False),
    ],
    ids=["agents", "untagged", "tagged", "daily", "a long episode tagged", "a long episode untagged"],
)
def test_generated_corpora_grouped_a_thread_at_a_time_are_grouped_as_whole(tmp_path, monkeypatch, make):
    make(tmp_path)
    assert _apart_equals_whole(tmp_path, monkeypatch) >= 1


def test_an_episode_split_from_its_run_is_judged_by_the_run_s_median(tmp_path, monkeypatch):
    _long_among_short(tmp_path, tagged=False)
    _apart_equals_whole(tmp_path, monkeypatch)
    with connect(default_db(tmp_path), read_only=True) as con:
        assert con.execute("SELECT n_turns, loop_reason FROM episodes WHERE looping").fetchall() == [
            (12, "12 turns, run median 2")
        ]
