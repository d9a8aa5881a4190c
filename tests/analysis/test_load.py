"""Loading segments, and the derive that follows it (lifecycle.ingest), on real segment files and
a real DuckDB file: incremental, idempotent, never fatal."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from toolproxy.analysis.lifecycle.ingest import ingest
from toolproxy.analysis.lifecycle.reanalyze import rebuild
from toolproxy.analysis.load import pipeline
from toolproxy.analysis.store.connection import WRITER_ROW_GROUP_SIZE, bodies_in_sql, connect, default_db
from toolproxy.record.model import Record, encode_body, new_id
from toolproxy.record.segments import read_records
from toolproxy.testing.corpus import generate_long

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def exchange(run="r1", episode="1", reply=None, status=200, messages=None, **kw) -> Record:
    rec = Record(
        id=new_id(),
        started_at=time.time(),
        run=run,
        episode=episode,
        method="POST",
        path="/v1/chat/completions",
        upstream="http://127.0.0.1:9",
        **kw,
    )
    body = orjson.dumps(
        {"model": "m", "messages": messages or [{"role": "user", "content": "weather?"}], "tools": TOOLS}
    )
    rec.request_body, rec.request_body_encoding = encode_body(body)
    rec.status = rec.client_status = status
    rec.response_headers = [["content-type", "application/json"]]
    reply = (
        reply
        if reply is not None
        else {
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "system_fingerprint": "fp_ollama",
        }
    )
    rec.response_body, rec.response_body_encoding = encode_body(orjson.dumps(reply))
    rec.response_complete = True
    return rec


def write(data: Path, name: str, records, tail: bytes = b"") -> Path:
    seg = data / "segments"
    seg.mkdir(parents=True, exist_ok=True)
    path = seg / name
    with open(path, "ab") as f:
        for r in records:
            f.write(r if isinstance(r, bytes) else orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE))
        f.write(tail)
    return path


@pytest.fixture
def db(tmp_path):
    cons = []

    def open_and_ingest(**kw):
        con = connect(default_db(tmp_path))
        cons.append(con)
        return ingest(con, tmp_path, **kw), con

    yield open_and_ingest
    for c in cons:
        c.close()


def test_incremental_and_idempotent(tmp_path, db):
    write(tmp_path, "a.jsonl", [exchange(episode="1"), exchange(episode="2")])
    s, con = db()
    assert (s.new_exchanges, s.turns, s.episodes, s.runs) == (2, 2, 2, ["r1"])
    s, con = db()
    assert (s.records, s.new_exchanges, s.segments_read) == (0, 0, 0)
    # the proxy appends to the same segment and starts a new one
    write(tmp_path, "a.jsonl", [exchange(episode="3")])
    write(tmp_path, "b.jsonl", [exchange(run="r2")])
    s, con = db()
    assert (s.new_exchanges, s.segments_read, sorted(s.runs)) == (2, 2, ["r1", "r2"])
    assert con.execute("SELECT run, n_exchanges, n_episodes, n_turns, stack FROM runs ORDER BY run").fetchall() == [
        ("r1", 3, 3, 3, "ollama"),
        ("r2", 1, 1, 1, "ollama"),
    ]
    assert con.execute("SELECT count(*) FROM turns").fetchall()[0][0] == 4
    # r1 was derived twice: its rows were replaced, not added (turns and episodes have no key since step 5)
    assert con.execute("SELECT count(*), count(DISTINCT turn_id) FROM turns").fetchall()[0] == (4, 4)
    assert con.execute("SELECT count(*), count(DISTINCT episode_key) FROM episodes").fetchall()[0] == (4, 4)
    assert con.execute("SELECT count(*), count(DISTINCT turn_id) FROM calls").fetchall()[0] == (4, 4)
    assert con.execute("SELECT count(*) FROM tool_sets").fetchall()[0][0] == 1


@pytest.mark.parametrize("batch_bytes", [1, 8 << 20], ids=["a chunk per line", "one chunk"])
def test_torn_tail_is_retried_and_corrupt_lines_reported(tmp_path, db, batch_bytes):
    good = exchange()
    later = exchange(episode="2")
    line = orjson.dumps(later, option=orjson.OPT_APPEND_NEWLINE)
    path = write(tmp_path, "a.jsonl", [good, b"{not json\n", b"\n", b"[1,2]\n"], tail=line[:40])
    s, con = db(batch_bytes=batch_bytes)
    assert s.new_exchanges == 1 and s.torn_tails == 1
    issues = con.execute("SELECT kind, message FROM ingest_issues ORDER BY byte_offset").fetchall()
    assert [k for k, _ in issues] == ["corrupt", "corrupt", "torn_tail"]
    assert any("incomplete last line" in m for m in s.issues)
    # the writer finishes the line: the next run picks it up and the torn-tail issue goes away
    with open(path, "ab") as f:
        f.write(line[40:])
    s, con = db(batch_bytes=batch_bytes)
    assert s.new_exchanges == 1 and s.torn_tails == 0
    assert [k for (k,) in con.execute("SELECT kind FROM ingest_issues ORDER BY byte_offset").fetchall()] == [
        "corrupt",
        "corrupt",
    ]
    assert con.execute("SELECT count(*) FROM exchanges").fetchall()[0][0] == 2


@pytest.mark.parametrize("batch_bytes", [1, 8 << 20], ids=["a chunk per line", "one chunk"])
def test_whitespace_lines_are_skipped_and_indented_records_read(tmp_path, db, batch_bytes):
    """A worker cuts its range into lines itself: a line of whitespace is no record (nor a
    corrupt one), a record line may start with whitespace or end with a carriage return, and a
    corrupt line is reported at its own offset."""
    a, b = exchange(), exchange(episode="2")
    path = write(
        tmp_path,
        "a.jsonl",
        [
            b"   \r\n",
            b"\t" + orjson.dumps(a) + b"\r\n",
            b"\n\x0c\n",
            b"{oops\n",
            b" " + orjson.dumps(b, option=orjson.OPT_APPEND_NEWLINE),
        ],
    )
    s, con = db(batch_bytes=batch_bytes)
    assert s.new_exchanges == 2
    data = path.read_bytes()
    assert con.execute("SELECT kind, byte_offset FROM ingest_issues").fetchall() == [("corrupt", data.index(b"{oops"))]
    assert con.execute("SELECT id, segment_offset FROM exchanges ORDER BY segment_offset").fetchall() == [
        (a.id, data.index(b"\t")),
        (b.id, data.index(b"{oops") + 6),
    ]


def test_copied_segment_adds_nothing_and_unknown_kinds_are_reported(tmp_path, db):
    recs = [exchange(), exchange(episode="2")]
    write(tmp_path, "a.jsonl", recs)
    write(tmp_path, "copy.jsonl", recs + [{"kind": "mystery", "id": "X1"}, {"kind": "exchange"}])
    s, con = db()
    assert (s.new_exchanges, s.duplicates) == (2, 2)
    assert sorted(k for (k,) in con.execute("SELECT kind FROM ingest_issues").fetchall()) == ["corrupt", "unknown_kind"]
    # a copy arriving after the first analysis meets the stored rows, not the ones of its own run
    write(tmp_path, "later-copy.jsonl", recs + [exchange(episode="3")])
    s, con = db()
    assert (s.new_exchanges, s.duplicates) == (1, 2)
    assert con.execute("SELECT count(*), count(DISTINCT id) FROM exchanges").fetchall() == [(3, 3)]


@pytest.mark.parametrize("collide", [False, True], ids=["hashes", "every hash the same"])
def test_a_copy_of_records_stored_long_before_in_the_same_run_is_found(tmp_path, db, monkeypatch, collide):
    """A fresh analyze remembers the ids it stored, the older ones as hashes only (_StoredIds.FOLD):
    a copy met after they were folded is still skipped, and a record whose hash matches a stored
    one's but whose id does not is stored (the database has the last word)."""
    monkeypatch.setattr(pipeline._StoredIds, "FOLD", 4)
    if collide:
        monkeypatch.setattr(pipeline, "hash", lambda _: 7, raising=False)
    recs = [exchange(episode=str(n)) for n in range(40)]
    write(tmp_path, "a.jsonl", recs[:30])
    write(tmp_path, "b.jsonl", recs[30:] + recs[:3] + recs[25:28])
    s, con = db(batch_bytes=1)  # a batch per record: the first ones are folded long before their copies
    assert (s.new_exchanges, s.duplicates) == (40, 6)
    assert con.execute("SELECT count(*), count(DISTINCT id) FROM exchanges").fetchall() == [(40, 40)]


FINGERPRINTS = [
    # as toolproxy.stacks.fingerprint writes it: the fingerprint in `extra`
    (
        {"extra": {"stack": "vllm", "version": "0.11.0", "model": "Qwen/Qwen3-8B", "evidence": ["GET /version"]}},
        ("vllm", "0.11.0"),
    ),
    ({"stack": "llamacpp", "stack_version": "b6512"}, ("llamacpp", "b6512")),
    # an unidentified stack leaves the run to its response markers (fp_ollama in these exchanges)
    ({"extra": {"stack": "unknown", "version": None}}, ("ollama", None)),
]


@pytest.mark.parametrize("fields,expected", FINGERPRINTS)
def test_fingerprint_records_set_the_run_stack(tmp_path, db, fields, expected):
    fp = {
        "kind": "fingerprint",
        "id": new_id(),
        "started_at": time.time(),
        "run": "r1",
        "upstream": "http://127.0.0.1:9",
        **fields,
    }
    write(tmp_path, "a.jsonl", [exchange(), fp])
    s, con = db()
    assert s.fingerprints == 1
    assert con.execute("SELECT stack, stack_version FROM runs WHERE run = 'r1'").fetchall()[0] == expected


def test_untagged_goes_to_untagged_run_and_retries_form_one_turn(tmp_path, db):
    fail = {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}
    write(
        tmp_path,
        "a.jsonl",
        [
            exchange(run=None, episode=None, reply=fail, status=500),
            exchange(run=None, episode=None, reply=fail, status=500),
            exchange(run=None, episode=None, messages=[{"role": "user", "content": "other"}], reply=fail, status=500),
        ],
    )
    s, con = db()
    rows = con.execute("SELECT run, outcome, sub_kind, n_attempts FROM turns ORDER BY turn_id").fetchall()
    assert rows == [("(untagged)", "non_response", "http_5xx", 2), ("(untagged)", "non_response", "http_5xx", 1)]
    assert con.execute("SELECT count(*) FROM episodes WHERE reconstructed").fetchall()[0][0] == 2


def test_worker_processes_give_the_same_result(tmp_path):
    recs = [exchange(episode=str(i)) for i in range(30)]
    for d in ("inline", "pool"):
        write(tmp_path / d, "a.jsonl", recs)
    results = []
    for d, workers in (("inline", 0), ("pool", 2)):
        con = connect(default_db(tmp_path / d))
        s = ingest(con, tmp_path / d, batch_bytes=3000, workers=workers)
        assert s.workers == workers and s.new_exchanges == 30
        results.append(
            con.execute("SELECT id, outcome, surface, turn_id, state_hash FROM exchanges ORDER BY id").fetchall()
        )
        con.close()
    assert results[0] == results[1]


def test_migrations_are_recorded_and_rerun_safely(tmp_path):
    con = connect(tmp_path / "x.duckdb")
    con.close()
    con = connect(tmp_path / "x.duckdb")
    assert con.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [
        (1,),
        (2,),
        (3,),
        (4,),
        (5,),
        (6,),
        (7,),
        (8,),
        (9,),
        (10,),
        (11,),
        (12,),
        (13,),
    ]
    con.close()


def test_a_database_analysed_before_step_5_keeps_its_turns_and_episodes(tmp_path):
    """Step 5 rebuilds turns and episodes without their keys: same columns, same rows, and a run's
    rows are then deleted and rewritten by the next derive like any other."""
    import duckdb

    from toolproxy.analysis.store.migrations import MIGRATIONS
    from toolproxy.analysis.store.tables import EPISODES, TURNS

    write(tmp_path, "a.jsonl", [exchange(episode="1"), exchange(episode="2")])
    path = tmp_path / "old.duckdb"
    old = duckdb.connect(str(path))
    old.execute("CREATE TABLE schema_version (version INTEGER, applied_at TIMESTAMP)")
    for version, _, sql in MIGRATIONS[:4]:
        old.execute(sql)
        old.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [version])
    columns = (
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_name IN ('turns', 'episodes') ORDER BY table_name, ordinal_position"
    )
    before = old.execute(columns).fetchall()
    old.execute("INSERT INTO turns (turn_id, run, turn_index) VALUES ('t0', 'r0', 0)")
    old.execute("INSERT INTO episodes (episode_key, run, n_turns) VALUES ('e0', 'r0', 1)")
    old.close()
    con = connect(path)
    later = [
        ("turns", name, TURNS.types[name])  # steps 6 and 7
        for name in ("protocol", "rejected", "finishes", "last_with_tools", "finisher")
    ]
    links = [
        ("episodes", name, EPISODES.types[name])  # step 12
        for name in ("parent_episode", "parent_call", "link", "task_key")
    ]
    # each table's new columns after its old ones (the query orders by table, then position)
    want = before + links + later
    assert con.execute(columns).fetchall() == sorted(want, key=lambda c: (c[0], want.index(c)))
    assert con.execute(
        "SELECT count(*) FROM information_schema.table_constraints WHERE table_name IN ('turns', 'episodes')"
    ).fetchall() == [(0,)]
    assert con.execute("SELECT turn_id, run, turn_index FROM turns").fetchall() == [("t0", "r0", 0)]
    assert con.execute("SELECT episode_key, run, n_turns FROM episodes").fetchall() == [("e0", "r0", 1)]
    assert ingest(con, tmp_path).new_exchanges == 2
    rows = con.execute("SELECT turn_id, episode_key FROM turns WHERE run = 'r1'").fetchall()
    write(tmp_path, "a.jsonl", [exchange(episode="3")])
    assert ingest(con, tmp_path).runs == ["r1"]
    after = con.execute("SELECT turn_id, episode_key FROM turns WHERE run = 'r1'").fetchall()
    assert len(rows) == 2 and len(after) == 3 and set(rows) < set(after)
    assert con.execute("SELECT count(*), count(DISTINCT episode_key) FROM episodes").fetchall()[0] == (4, 4)
    con.close()


def test_rewritten_exchange_is_judged_on_what_the_harness_got(tmp_path, db):
    """template condition: chat request rendered to Ollama /api/generate, reply parsed into tool_calls."""
    rec = exchange(condition="template")
    raw = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    rec.upstream_request = {
        "path": "/api/generate",
        "query": "",
        "headers": [],
        "body": '{"prompt": "..."}',
        "body_encoding": "utf8",
    }
    rec.response_body, _ = encode_body(
        b"".join(
            orjson.dumps(o) + b"\n"
            for o in (
                {"model": "m", "response": raw[:30], "done": False},
                {"model": "m", "response": raw[30:], "done": True, "done_reason": "stop"},
            )
        )
    )
    rec.response_headers = [["content-type", "application/x-ndjson"]]
    rec.client_body, rec.client_body_encoding = encode_body(
        orjson.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                                }
                            ],
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            }
        )
    )
    write(tmp_path, "a.jsonl", [rec])
    s, con = db()
    row = con.execute(
        "SELECT outcome, surface, harness_saw_prose, upstream_content, stack_marker FROM exchanges"
    ).fetchall()[0]
    assert row == ("valid_call", "text", False, raw, "ollama")


def as_dict(rec: Record, **changes) -> dict:
    d = orjson.loads(orjson.dumps(rec))
    d.update(changes)
    return d


# Fields the proxy always writes with one JSON type, given another: each blocked every later
# line once (DuckDB's failed CAST aborted the ingest transaction, on every rerun).
WRONG_TYPES = [
    ({"status": 1099511627776}, '"status" is 1099511627776'),
    ({"status": True}, '"status" is true (a boolean)'),
    ({"started_at": "yesterday"}, '"started_at" is "yesterday" (a string)'),
    ({"started_at": 1e300}, '"started_at" is 1e+300'),
    ({"ttfb_ms": "fast"}, '"ttfb_ms" is "fast"'),
    ({"run": 5}, '"run" is 5 (a number)'),
    ({"run": {"name": "x"}}, '"run" is {"name":"x"} (an object)'),
    ({"run": {}}, '"run" is {} (an object)'),
    ({"condition": False}, '"condition" is false (a boolean)'),
    ({"path": ["/v1/chat/completions"]}, '"path" is ["/v1/chat/completions"] (an array)'),
    ({"request_body": 12}, '"request_body" is 12'),
    ({"kind": 3}, '"kind" is 3'),
]


@pytest.mark.parametrize(
    "change,message", WRONG_TYPES, ids=[next(iter(c)) + "=" + repr(next(iter(c.values()))) for c, _ in WRONG_TYPES]
)
def test_a_wrongly_typed_record_is_set_aside_and_the_rest_ingests(tmp_path, db, change, message):
    before, bad, after = exchange(episode="1"), exchange(episode="2"), exchange(episode="3")
    write(tmp_path, "a.jsonl", [before, as_dict(bad, **change), after])
    s, con = db()
    assert s.new_exchanges == 2 and s.set_aside == {"bad_type": 1}
    assert sorted(r[0] for r in con.execute("SELECT id FROM exchanges").fetchall()) == sorted([before.id, after.id])
    ((segment, offset, record_id, kind, text),) = con.execute(
        "SELECT segment, byte_offset, record_id, kind, message FROM ingest_issues"
    ).fetchall()
    assert (segment, record_id, kind) == ("a.jsonl", bad.id, "bad_type")
    assert offset == len(orjson.dumps(before)) + 1 and message in text
    # rerunning stays idempotent: nothing new, the issue is not repeated, later lines still ingest
    write(tmp_path, "a.jsonl", [exchange(episode="4")])
    s, con = db()
    assert (s.new_exchanges, s.set_aside) == (1, {})
    assert con.execute("SELECT count(*) FROM exchanges").fetchall()[0][0] == 3
    assert con.execute("SELECT count(*) FROM ingest_issues").fetchall()[0][0] == 1


def test_the_record_readers_types_are_the_columns_analyze_stores_the_fields_in():
    """The verdict on a record (toolproxy.record.schema) is the one analyze sets lines aside by:
    each field it judges goes in an exchanges column of its type, and every record field with a
    typed column is judged."""
    from toolproxy.analysis.store.tables import EXCHANGES
    from toolproxy.record.schema import STORED

    typed = {name: t for name, t in EXCHANGES.types.items() if name in Record.__dataclass_fields__ and t != "JSON"}
    assert STORED == typed


def test_odd_values_in_bodies_are_stored_not_set_aside(tmp_path, db):
    """What an upstream or a model writes is not the proxy's record: the exchange is ingested, a
    column that cannot hold the value holds NULL (numbers) or its JSON text, the body keeps it."""
    reply = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": 5, "arguments": "{}"}}],
                },
                "finish_reason": {"why": "done"},
            }
        ],
        "usage": {"prompt_tokens": "many", "completion_tokens": 18446744073709551615},
        "model": ["m"],
    }
    rec = exchange(reply=reply)
    write(tmp_path, "a.jsonl", [rec])
    s, con = db()
    assert s.new_exchanges == 1 and s.set_aside == {}
    assert con.execute("SELECT prompt_tokens, completion_tokens, finish_reason FROM exchanges").fetchall() == [
        (None, None, '{"why":"done"}')
    ]
    assert con.execute("SELECT name FROM calls").fetchall() == [("5",)]
    with bodies_in_sql(con, tmp_path):
        body = con.execute("SELECT bodies(segment, segment_offset).response_body FROM exchanges").fetchall()[0][0]
    assert orjson.loads(body) == reply
    # rebuilding the derived tables from the recorded exchanges meets the same values
    assert rebuild(con, None, exchanges=True, data_dir=tmp_path)["exchanges"] == 1
    assert con.execute("SELECT prompt_tokens, completion_tokens, finish_reason FROM exchanges").fetchall() == [
        (None, None, '{"why":"done"}')
    ]


def test_entries_that_are_not_readable_files_are_skipped_with_a_note(tmp_path, db):
    write(tmp_path, "b.jsonl", [exchange()])
    seg = tmp_path / "segments"
    (seg / "a.jsonl").mkdir()
    os.mkfifo(seg / "c.jsonl")  # opening a FIFO would wait forever for a writer
    (seg / "d.jsonl").symlink_to(seg / "gone.jsonl")
    s, con = db()
    assert s.new_exchanges == 1 and s.segments == 1
    assert sorted(s.issues) == [
        "a.jsonl: not a regular file; skipped",
        "c.jsonl: not a regular file; skipped",
        "d.jsonl: cannot be read (No such file or directory); skipped",
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_segment_is_skipped_with_a_note(tmp_path, db):
    write(tmp_path, "b.jsonl", [exchange()])
    write(tmp_path, "a.jsonl", [exchange()]).chmod(0)
    s, con = db()
    assert s.new_exchanges == 1 and s.issues == ["a.jsonl: cannot be read (Permission denied); skipped"]


def test_a_failure_while_committing_surfaces_its_own_error(tmp_path):
    """A statement that fails inside the commit rolls the batch back once; the caller's handler
    rolling back again must not raise "no transaction is active" over the real cause."""
    import duckdb

    from toolproxy.analysis.load.pipeline import Ingestor

    (tmp_path / "segments").mkdir()
    con = connect(default_db(tmp_path))
    ingestor = Ingestor(con, tmp_path)
    con.execute("BEGIN TRANSACTION")
    ingestor.in_txn = True
    ingestor.reached = {"seg.jsonl": ("not an offset", 1)}
    with pytest.raises(duckdb.Error, match="BIGINT"):  # the offset's type, not a rollback's complaint
        ingestor._commit()
    ingestor._rollback()  # what _write's handler does next
    assert not ingestor.in_txn
    assert con.execute("SELECT count(*) FROM ingest_state").fetchall() == [(0,)]


def test_bodies_read_by_every_duckdb_thread_at_once_are_the_recorded_ones(tmp_path, db):
    """DuckDB calls bodies() from each of its threads: records of one segment read by several
    threads at once each come back whole and its own (their reads once shared the file's position,
    and a record read back corrupt)."""
    n = 3 * WRITER_ROW_GROUP_SIZE  # DuckDB's threads each scan row groups of their own
    generate_long(tmp_path, n, segment_records=n)  # one segment: every thread reads the same file
    s, con = db()
    assert s.new_exchanges == n
    con.execute("SET threads = 4")
    want = {r["id"]: (r["request_body"], r["response_body"]) for r in read_records(tmp_path, "exchange")}
    with bodies_in_sql(con, tmp_path):
        got = con.execute(
            "SELECT id, b.request_body, b.response_body FROM "
            "(SELECT id, bodies(segment, segment_offset) AS b FROM exchanges)"
        ).fetchall()
    assert {i: (a, b) for i, a, b in got} == want
