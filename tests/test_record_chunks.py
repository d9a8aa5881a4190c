"""Repeated body content stored once per segment: exact round trips, damage, crashes, the analyzer.

Records go through the real SegmentWriter (its writer thread, real files, fsync) and come back
through the real readers: read_records, analyze's ingest into a real DuckDB file (in-process, in
worker processes reading byte ranges, and `toolproxy analyze`/`show --raw` as subprocesses).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import duckdb
import orjson
import pytest

from toolproxy.analysis.classify.keys import link_map, parent_walk
from toolproxy.analysis.lifecycle.ingest import ingest
from toolproxy.analysis.store.connection import bodies_in_sql, connect
from toolproxy.record.chunks import INLINE_BODY_CHARS, MAX_CHUNK, MIN_CHUNK, ChunkPacker, ChunkSource, cut_points
from toolproxy.record.model import RECORD_VERSION, Record, RecordEncodeError, encode_body, new_id
from toolproxy.record.segments import batch_end, expanded_size, list_segments, read_lines, read_records, read_segment
from toolproxy.record.writer import SegmentWriter
from toolproxy.testing.corpus import episode, interleaved

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "does a thing " * 40,
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
    for i in range(5)
]


def history_bodies(turns: int, dumps=lambda o: orjson.dumps(o)) -> list[bytes]:
    """Chat requests of one episode: the whole history resent each turn, ~1.5 KB more per turn."""
    messages = [{"role": "system", "content": "You are an agent. " * 40}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"step {t}: " + "look at the logs and say what broke. " * 20})
        out.append(dumps({"model": "m", "messages": messages, "tools": TOOLS, "stream": False}))
        messages.append({"role": "assistant", "content": f"answer {t} " + "the cache was stale. " * 15})
    return out


def record(request: bytes | None = None, response: bytes | None = None, **fields) -> Record:
    rec = Record(id=new_id(), started_at=time.time(), method="POST", path="/v1/chat/completions", **fields)
    rec.request_body, rec.request_body_encoding = encode_body(request)
    rec.response_body, rec.response_body_encoding = encode_body(response)
    return rec


def write(data: Path, records: list[Record], **options) -> SegmentWriter:
    w = SegmentWriter(data, **options)
    w.start()
    for r in records:
        assert w.submit(r)
    w.close()
    assert w.stats.written == len(records) and not w.stats.degraded
    return w


def wire(rec: dict, field: str = "request_body") -> bytes | None:
    text, enc = rec[field], rec[field + "_encoding"]
    if text is None:
        return None
    return base64.b64decode(text) if enc == "base64" else text.encode("utf-8")


def one_segment(data: Path, turns: int) -> tuple[list[bytes], Path, bytes]:
    """An episode's request bodies written to one segment: (bodies, the segment, its bytes)."""
    bodies = history_bodies(turns)
    write(data, [record(b) for b in bodies])
    [seg] = list_segments(data)
    return bodies, seg, seg.read_bytes()


def segment_bytes(data: Path) -> bytes:
    return b"".join(p.read_bytes() for p in list_segments(data))


# ---- cutting -------------------------------------------------------------------------------

CUT_CASES = [
    ("compact chat body", history_bodies(6)[-1]),
    ("json.dumps spacing", history_bodies(6, lambda o: json.dumps(o).encode())[-1]),
    ("pretty-printed", history_bodies(6, lambda o: json.dumps(o, indent=3).encode())[-1]),
    ("no cut point at all", b"x" * (3 * MAX_CHUNK + 17)),
    ("hostile: cut points everywhere", b"{}" + b",{}" * 200_000),
    ("a brace then a megabyte of spaces", b"}" + b" " * (1 << 20) + b"]"),
    ("empty", b""),
]


@pytest.mark.parametrize("name,data", CUT_CASES, ids=[c[0] for c in CUT_CASES])
def test_cut_points_cover_the_body_in_bounded_pieces(name, data):
    cuts = cut_points(data)
    assert cuts == sorted(set(cuts)) and (cuts[-1] == len(data) if data else cuts == [])
    sizes = [b - a for a, b in zip([0, *cuts], cuts)]
    assert all(s <= MAX_CHUNK for s in sizes)
    short = [i for i, size in enumerate(sizes[:-1]) if size <= MIN_CHUNK]
    assert all(i > 0 and sizes[i - 1] == MAX_CHUNK for i in short), "short pieces only end a body or a long span"


@pytest.mark.parametrize(
    "dumps",
    [orjson.dumps, lambda o: json.dumps(o).encode(), lambda o: json.dumps(o, indent=2).encode()],
    ids=["compact", "spaced", "indented"],
)
def test_a_resent_history_is_cut_as_before(dumps):
    """Turn n+1's body shares every chunk of turn n's messages, and its tools array's chunks."""
    a, b = history_bodies(5, dumps)[-2:]

    def pieces(data):
        cuts = cut_points(data)
        return [data[s:e] for s, e in zip([0, *cuts], cuts)]

    pa, pb = pieces(a), pieces(b)
    shared = set(pa) & set(pb)
    tools_at = a.index(b'"tools"')
    assert sum(map(len, shared)) >= 0.9 * len(a), "nearly all of the previous request is found again"
    assert all(p in shared for p in pa if a.index(p) + len(p) < tools_at - 8), "every old message chunk is reused"


# ---- byte-exact round trips through the writer and the readers --------------------------------

ODD_BODIES = [
    ("compact json", history_bodies(8)[-1]),
    ("spaced json", history_bodies(8, lambda o: json.dumps(o).encode())[-1]),
    (
        "escapes and control bytes",
        orjson.dumps(
            {
                "messages": [
                    {"content": '\x00\x1b[2J\u2028 \\ " é 𝄞 ' * 400},
                    {"content": "\\ud800 lone-surrogate text " * 200},
                ]
            }
        ),
    ),
    (
        "non-UTF-8 bytes",
        b'{"messages":[' + b",".join([b'{"c":"\xff\xfe\xc3(' + bytes(range(256)) + b'"}'] * 40) + b"]}",
    ),
    ("UTF-8 cut mid-character", "é".encode() * (MAX_CHUNK + 3) + b"}]"),
    ("random binary", random.Random(5).randbytes(200_000)),
    (
        "base64 text in a JSON body",
        orjson.dumps({"image": base64.b64encode(random.Random(6).randbytes(50_000)).decode()}),
    ),
    (
        "SSE stream",
        b"".join(b'data: {"choices":[{"delta":{"content":"tok%d "}}]}\n\n' % i for i in range(400))
        + b"data: [DONE]\n\n",
    ),
    ("exactly at the inline threshold", b"a" * INLINE_BODY_CHARS),
    ("one past the threshold", b"{}," * (INLINE_BODY_CHARS // 3) + b"{}}"),
]


def test_every_body_round_trips_byte_for_byte(tmp_path):
    recs = [record(body, body[::-1]) for _, body in ODD_BODIES]
    streamed = record(history_bodies(3)[-1], ODD_BODIES[7][1])
    rewritten = record(history_bodies(4)[-1], b"{}")
    rewritten.upstream_request = {"path": "/completion", "query": "", "headers": [["a", "b"]]}
    rewritten.upstream_request["body"], rewritten.upstream_request["body_encoding"] = encode_body(
        history_bodies(5)[-1] + b"\xff"
    )
    rewritten.client_body, rewritten.client_body_encoding = encode_body(history_bodies(2)[-1])
    recs += [streamed, rewritten]
    write(tmp_path, recs)

    back = read_records(tmp_path)
    assert [r["id"] for r in back] == [r.id for r in recs]
    for rec, got in zip(recs, back):
        for field in ("request_body", "response_body", "client_body"):
            assert got[field] == getattr(rec, field) and got[field + "_encoding"] == getattr(rec, field + "_encoding")
            assert field + "_chunks" not in got
        assert got["v"] == RECORD_VERSION  # 2 brought chunks; 3 (header bytes) keeps them
    assert back[-1]["upstream_request"] == rewritten.upstream_request
    assert wire(back[0]) == ODD_BODIES[0][1] and wire(back[3]) == ODD_BODIES[3][1]
    raw = segment_bytes(tmp_path)
    assert b'"request_body_chunks"' in raw and b'"body_chunks"' in raw, "large bodies were really stored as chunks"


def test_bodies_that_would_not_round_trip_are_left_inline(tmp_path):
    """Non-canonical base64 decodes to bytes whose re-encoding differs: the text is kept as given."""
    odd = record(None)
    odd.request_body, odd.request_body_encoding = "QR==" * 3000, "base64"
    write(tmp_path, [odd])
    [got] = read_records(tmp_path)
    assert got["request_body"] == odd.request_body and b"request_body_chunks" not in segment_bytes(tmp_path)


def test_an_episode_stores_its_history_once(tmp_path):
    bodies = history_bodies(40)
    write(tmp_path / "on", [record(b, b'{"choices":[]}') for b in bodies])
    write(tmp_path / "off", [record(b, b'{"choices":[]}') for b in bodies], dedup=False)
    assert [wire(r) for r in read_records(tmp_path / "on")] == bodies
    on, off = len(segment_bytes(tmp_path / "on")), len(segment_bytes(tmp_path / "off"))
    assert off > sum(map(len, bodies)) and on < 0.1 * off


def test_benchmark_episode_meets_the_storage_target(tmp_path):
    """The benchmark's 50-turn episode growing 2 KB a turn: bytes on disk / raw request bytes.

    Deterministic (seeded content, fixed-length ids, deterministic zlib), so not flaky."""
    one = episode(random.Random(11), 0, 50, 2048)
    write(tmp_path, one)
    ratio = len(segment_bytes(tmp_path)) / sum(r.request_body_size for r in one)
    assert ratio <= 0.1
    assert [r["request_body"] for r in read_records(tmp_path)] == [r.request_body for r in one]


def test_rotation_writes_chunks_again_in_the_new_segment(tmp_path):
    """Each segment holds the chunks its records use: one segment read alone, or deleted, is whole."""
    bodies = history_bodies(12)
    w = SegmentWriter(tmp_path, segment_bytes=1, poll=0.005)
    w.start()
    for b in bodies:
        assert w.submit(record(b))
        time.sleep(0.02)  # about one batch, so one segment, per record
    w.close()
    segs = list_segments(tmp_path)
    assert len(segs) > len(bodies) // 2
    got = []
    for seg in reversed(segs):
        assert b'{"kind":"chunk"' in seg.read_bytes()
        lines = list(read_segment(seg))
        assert lines and all(line.error is None for line in lines)
        got = [line.record["request_body"].encode() for line in lines] + got
        seg.unlink()  # the segments before it never needed it
    assert got == bodies


def test_a_lost_write_makes_the_packer_start_a_fresh_index(tmp_path):
    """If a batch's bytes never reached the file, later records must not point at its chunks."""
    path = tmp_path / "seg.jsonl"
    packer = ChunkPacker()
    bodies = history_bodies(4)
    with open(path, "ab") as f:
        f.write(packer.pack([(record(bodies[0]), None, None)], f))
        packer.pack([(record(bodies[1]), None, None)], f)  # lost: never written
        f.write(packer.pack([(record(bodies[2]), None, None)], f))
    got = [line.record["request_body"].encode() for line in read_segment(path)]
    assert got == [bodies[0], bodies[2]]


# ---- damage and crashes ------------------------------------------------------------------------


def test_a_torn_tail_inside_chunk_lines_loses_only_the_unfinished_record(tmp_path):
    bodies, seg, data = one_segment(tmp_path, 6)
    last_record = data.rindex(b'{"id"')
    last_chunk = data.rindex(b'{"kind":"chunk"', 0, last_record)
    seg.write_bytes(data[: last_chunk + 40])  # a crash while the last batch's chunks were written

    lines = list(read_segment(seg))
    assert [ln.error for ln in lines] == [None] * 5 + ["torn_tail"]
    assert [ln.record["request_body"].encode() for ln in lines[:5]] == bodies[:5]

    con = connect(tmp_path / "db.duckdb")
    s = ingest(con, tmp_path, workers=0)
    assert s.new_exchanges == 5 and s.torn_tails == 1
    con.close()


def test_damaged_or_hostile_references_are_reported_never_wrong(tmp_path):
    _, seg, data = one_segment(tmp_path, 3)
    first_chunk_data = data.index(b'"data":"') + 20
    damaged = (
        data[:first_chunk_data]
        + (b"A" if data[first_chunk_data : first_chunk_data + 1] != b"A" else b"B")
        + data[first_chunk_data + 1 :]
    )
    first_record = data.index(b'{"id"')
    hostile = [
        {"id": "h1", "request_body": None, "request_body_encoding": "utf8", "request_body_chunks": [-1]},
        {"id": "h2", "request_body": None, "request_body_encoding": "utf8", "request_body_chunks": [10**12]},
        {"id": "h3", "request_body": None, "request_body_encoding": "utf8", "request_body_chunks": [True]},
        {"id": "h4", "request_body": None, "request_body_encoding": "utf8", "request_body_chunks": [first_record]},
        {"id": "h5", "request_body": None, "request_body_encoding": "utf8", "request_body_chunks": "0"},
        {"id": "h6", "upstream_request": {"body": None, "body_chunks": [3]}},
    ]
    seg.write_bytes(damaged + b"".join(orjson.dumps(h) + b"\n" for h in hostile))

    lines = list(read_segment(seg))
    assert [ln.record is None for ln in lines] == [True] * 3 + [True] * len(hostile), (
        "the damaged chunk is used by every turn"
    )
    assert all(ln.error.startswith("corrupt:") for ln in lines)
    assert "does not match its id" in lines[0].error or "unreadable" in lines[0].error

    con = connect(tmp_path / "db.duckdb")
    s = ingest(con, tmp_path, workers=0)
    assert s.new_exchanges == 0 and s.new_issues == 3 + len(hostile)
    con.close()


def test_old_version_1_segments_stay_readable(tmp_path):
    seg = tmp_path / "segments" / "20250101T000000-1-0001.jsonl"
    seg.parent.mkdir(parents=True)
    body = history_bodies(5)[-1].decode()
    seg.write_text(
        json.dumps(
            {
                "id": "0190aaaa",
                "kind": "exchange",
                "v": 1,
                "started_at": 1.0,
                "method": "POST",
                "path": "/v1/chat/completions",
                "request_body": body,
                "request_body_encoding": "utf8",
                "status": 200,
            }
        )
        + "\n"
    )
    [got] = read_records(tmp_path)
    assert got["request_body"] == body and got["v"] == 1
    con = connect(tmp_path / "db.duckdb")
    assert ingest(con, tmp_path, workers=0).new_exchanges == 1
    with bodies_in_sql(con, tmp_path):
        assert con.execute("SELECT bodies(segment, segment_offset).request_body FROM exchanges").fetchall() == [(body,)]
    con.close()


# ---- the analyzer sees the same exchanges with dedup on and off ---------------------------------


def _exchanges(db: Path) -> list[tuple]:
    """Every exchange row but where it lies, with the parent keys it walks instead of the links back
    it stores (which requests store which links follows how batches fall: keys.Prefixes)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT * EXCLUDE (segment, segment_offset, prefix_links), prefix_links, run, "
            "parent_hashes, prior_hash FROM exchanges ORDER BY id"
        ).fetchall()
    finally:
        con.close()
    links: dict = {}
    for *_, pairs, run, _parents, _prior in rows:
        links.setdefault(run, []).append(pairs)
    maps = {run: link_map(p) for run, p in links.items()}
    return [
        (*row[:-4], None if row[-2] is None else list(parent_walk(row[-2], row[-1], maps[row[-3]]))) for row in rows
    ]


@pytest.mark.parametrize("workers", [0, 2])
def test_analyzer_sees_identical_exchanges_with_dedup_on_and_off(tmp_path, workers):
    rnd = random.Random(2)
    recs = [r for n in range(3) for r in episode(rnd, n, 12, 2048)]
    recs.append(record(ODD_BODIES[3][1], ODD_BODIES[7][1], run="bench"))
    write(tmp_path / "on", recs)
    write(tmp_path / "off", recs, dedup=False)
    for d in ("on", "off"):
        con = connect(tmp_path / d / "db.duckdb")
        # Small batches: most records' chunks lie before the byte range a worker reads.
        s = ingest(con, tmp_path / d, batch_bytes=16 * 1024, workers=workers)
        con.close()
        assert s.new_exchanges == len(recs) and not s.issues, s.issues
    on, off = _exchanges(tmp_path / "on" / "db.duckdb"), _exchanges(tmp_path / "off" / "db.duckdb")
    assert len(on) == len(recs) and on == off


async def test_proxy_records_and_show_raw_reproduce_the_wire(fake_stack, proxy, tmp_path):
    """Through `toolproxy serve`: a growing conversation (one turn streamed, one with odd bytes),
    then `toolproxy analyze` and `show --raw` as a user runs them."""
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--durability", "sync")
    sent = [
        json.dumps({**json.loads(b), "model": "gpt-4o-mini", "stream": i == 3}, indent=i % 3).encode()
        for i, b in enumerate(history_bodies(8))
    ]
    sent[5] = sent[5][:-1] + b' , "x": "\xff\xfe"}'  # not UTF-8 (the fake may refuse it; it is recorded anyway)
    async with aiohttp.ClientSession() as s:
        for body in sent:
            async with s.post(
                p.url + "/t/run=dd/episode=1/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as r:
                await r.read()
    p.stop()
    recs = p.records()
    assert [wire(r) for r in recs] == sent
    assert recs[3]["response_body"].startswith("data: ") and recs[3]["response_complete"]
    assert len(segment_bytes(p.data)) < 0.5 * sum(map(len, sent))

    tp = [sys.executable, "-c", "from toolproxy.cli import main; main()"]
    out = subprocess.run([*tp, "analyze", "--data", str(p.data)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "issues: none" in out.stdout, out.stdout + out.stderr
    # the database keeps no copy of the bodies: SQL reads them from the segments, chunks put back
    query = (
        "SELECT id, bodies(segment, segment_offset).request_body AS t, "
        "bodies(segment, segment_offset).request_body_encoding AS e FROM exchanges ORDER BY id"
    )
    out = subprocess.run(
        [*tp, "sql", "--data", str(p.data), "--format", "json", query], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    rows = [(r["id"], r["t"], r["e"]) for r in json.loads(out.stdout)]
    assert [base64.b64decode(t) if e == "base64" else t.encode() for _, t, e in rows] == sent
    shown = subprocess.run(
        [*tp, "show", "--data", str(p.data), "--raw", rows[-1][0]], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    last_message = next(line for line in sent[-1].decode().splitlines() if "step 7:" in line)
    assert "== raw request body" in shown.stdout and last_message in shown.stdout


def test_chunk_source_serves_offsets_outside_its_buffer(tmp_path):
    """What an analyzer worker does: its range starts after the chunks its records use."""
    bodies, seg, data = one_segment(tmp_path, 5)
    start = data.rindex(b'{"id"')
    rec = orjson.loads(data[start:-1])
    with ChunkSource(seg, data[start:], start) as chunks:
        assert chunks.resolve(rec) is None
    assert rec["request_body"].encode() == bodies[-1]


async def test_kill_9_while_writing_chunked_episodes(fake_stack, proxy):
    """Sync durability, agents resending growing histories, then SIGKILL: every response a client
    fully received has its record with its exact body; no complete line is corrupt, and no record
    points at a chunk that did not reach the disk."""
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--durability", "sync", "--segment-size", "200000")
    complete: dict[str, bytes] = {}
    stop = asyncio.Event()

    async def agent(a: int) -> None:
        async with aiohttp.ClientSession() as s:
            for turn, body in enumerate(
                history_bodies(60, lambda o: json.dumps({**o, "model": "gpt-4o-mini", "user": f"agent-{a}"}).encode())
            ):
                if stop.is_set():
                    return
                try:
                    async with s.post(
                        p.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
                    ) as r:
                        await r.read()
                except (TimeoutError, aiohttp.ClientError):
                    return
                if r.status == 200:
                    complete[f"{a}-{turn}"] = body

    tasks = [asyncio.create_task(agent(a)) for a in range(6)]
    # Kill once enough responses are complete and the segment has rolled over, however slowly a
    # loaded machine gets there (a fixed sleep was too short under load and wasted time when idle).
    deadline = time.monotonic() + 60
    while (
        (len(complete) <= 20 or len(list_segments(p.data)) <= 1)
        and time.monotonic() < deadline
        and not all(t.done() for t in tasks)
    ):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # still writing when killed
    p.kill()
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 15)
    assert len(complete) > 20

    lines = [line for seg in list_segments(p.data) for line in read_segment(seg)]
    assert not [ln for ln in lines if ln.error and ln.error != "torn_tail"], (
        "a complete line is corrupt or lost its chunks"
    )
    assert len(list_segments(p.data)) > 1
    recorded = {wire(ln.record) for ln in lines if ln.record}
    assert not [k for k, body in complete.items() if body not in recorded]


def _random_body(rnd: random.Random, parts: list[bytes]) -> bytes:
    return b'{"messages":[' + b",".join(parts) + b"]" + rnd.choice([b"", b' , "tools" : [{"a":1},{"b":2}]']) + b"}"


def _random_part(rnd: random.Random) -> bytes:
    ws = [b"", b" ", b"\n  ", b"\t"]
    text = "".join(rnd.choice('ab}{],[ \n"é') for _ in range(rnd.choice([3, 40, 300, 900])))
    return b"{" + rnd.choice(ws) + b'"c":' + orjson.dumps(text) + rnd.choice(ws) + b"}" + rnd.choice(ws)


def test_reusing_an_earlier_bodys_prefix_cuts_exactly_as_cutting_afresh(tmp_path):
    """The packer skips cutting and hashing a history it has packed before; whatever the bodies
    (grown, edited, truncated, other episodes with the same head), every record's chunks are
    exactly the body's own cut points and bytes."""
    rnd = random.Random(9)
    head = [b'{"c":' + orjson.dumps("system " * 700) + b"}"]
    episodes = [list(head) for _ in range(4)]
    bodies = []
    for _ in range(300):
        parts = rnd.choice(episodes)
        r = rnd.random()
        if r < 0.7:
            parts.append(_random_part(rnd))
        elif r < 0.85 and len(parts) > 2:
            parts[rnd.randrange(1, len(parts))] = _random_part(rnd)
        elif len(parts) > 2:
            del parts[rnd.randrange(1, len(parts)) :]
        bodies.append(_random_body(rnd, parts))
    path = tmp_path / "seg.jsonl"
    packer = ChunkPacker()
    with open(path, "ab") as f:
        for body in bodies:
            f.write(packer.pack([(record(body), None, None)], f))
    with ChunkSource(path) as chunks:
        for line, body in zip([ln for ln in path.read_bytes().splitlines() if ln.startswith(b'{"id"')], bodies):
            offsets = orjson.loads(line)["request_body_chunks"]
            pieces = [chunks.get(at) for at in offsets]
            ends = [sum(map(len, pieces[: i + 1])) for i in range(len(pieces))]
            assert b"".join(pieces) == body and ends == cut_points(body)


def test_a_body_that_extends_an_earlier_one_byte_for_byte_is_cut_as_afresh(tmp_path):
    """The hard cases for reuse: the earlier body's end, a short last piece, or a MAX_CHUNK split
    falls where the new body carries on (a stream recorded cut, then again in full)."""
    rnd = random.Random(4)
    alphabet = b"}}}{,,]  \nab"
    bodies = []
    for _ in range(40):
        body = bytes(rnd.choice(alphabet) for _ in range(INLINE_BODY_CHARS + rnd.randrange(600)))
        for _ in range(8):
            bodies.append(body)
            tail = (
                b"a" * (MAX_CHUNK + 100)
                if rnd.random() < 0.05
                else bytes(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 700)))
            )
            body += tail
    path = tmp_path / "seg.jsonl"
    packer = ChunkPacker(compress=False)
    with open(path, "ab") as f:
        for body in bodies:
            f.write(packer.pack([(record(body), None, None)], f))
    with ChunkSource(path) as chunks:
        for line, body in zip([ln for ln in path.read_bytes().splitlines() if ln.startswith(b'{"id"')], bodies):
            pieces = [chunks.get(at) for at in orjson.loads(line)["request_body_chunks"]]
            ends = [sum(map(len, pieces[: i + 1])) for i in range(len(pieces))]
            assert b"".join(pieces) == body and ends == cut_points(body)


EXPANDED = [
    ("a body stored whole", b'{"id":"a","request_body":"' + b"x" * 900 + b'","request_body_size":900}', 0),
    (
        "a chunked request",
        b'{"id":"a","request_body":null,"request_body_size":50000,"request_body_chunks":[1,2]}',
        50000,
    ),
    (
        "request and rewrite chunked",
        b'{"request_body_size":7000,"request_body_chunks":[1],"upstream_request":{"body_chunks":[2]}}',
        14000,
    ),
    ("chunked, size unknown", b'{"id":"a","response_body_chunks":[1]}', 1 << 20),
    ("the key only inside a string (escaped)", b'{"request_body":"\\"request_body_chunks\\":[1]"}', 0),
]


@pytest.mark.parametrize("name,line,extra", EXPANDED, ids=[c[0] for c in EXPANDED])
def test_expanded_size_counts_the_bodies_a_line_names(name, line, extra):
    assert expanded_size(line) == len(line) + extra


def test_analyze_batches_are_bounded_by_the_bytes_they_stand_for(tmp_path):
    """A dedup'd segment holds ~17x more body bytes than its size: batches count them in full."""
    recs = interleaved([episode(random.Random(n), n, 40, 2048) for n in range(4)])
    write(tmp_path, recs)
    [seg] = list_segments(tmp_path)
    budget = 1 << 20
    lines = {off: line for off, _, line in read_lines(seg)}
    batches = []
    with open(seg, "rb") as f:
        pos, size = 0, seg.stat().st_size
        while pos < size:
            end = batch_end(f, pos, size, budget)
            batches.append(sum(expanded_size(line) for off, line in lines.items() if pos <= off < end))
            pos = end
    assert len(batches) > sum(r.request_body_size for r in recs) // budget // 2
    assert max(batches) < budget + max(r.request_body_size for r in recs) + 4096


def test_a_batch_that_fails_to_serialise_leaves_no_phantom_chunks(tmp_path):
    """A record that cannot be serialised (an integer JSON cannot hold; odd text is stored, see
    record.model.encode_record) aborts its batch after its bodies' chunks were indexed: later
    records must not point at those unwritten chunks."""
    path = tmp_path / "seg.jsonl"
    packer = ChunkPacker()
    bodies = history_bodies(3)
    bad = record(bodies[1])
    bad.extra = {"huge": 1 << 70}
    with open(path, "ab") as f:
        f.write(packer.pack([(record(bodies[0]), None, None)], f))
        with pytest.raises(RecordEncodeError):
            packer.pack([(bad, None, None)], f)
        f.write(packer.pack([(record(bodies[1]), None, None)], f))
    assert [line.record["request_body"].encode() for line in read_segment(path)] == [bodies[0], bodies[1]]
