"""Re-analysis after new records derives only what they can change, and the result equals a fresh
analysis of all the records: exchanges, calls, turns, episodes and runs compared row for row.

Segments arrive the way production delivers them: later ones after an analysis, a middle one
late (its records older than ones already derived, landing inside episodes), replicas with their
own segments, and a conversation that crosses from one daily run into the next; tagged and
untagged traffic (whose episodes are reconstructed by chaining)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import orjson
import pytest

from toolproxy.analysis.store.connection import default_db
from toolproxy.record.model import Record, encode_body, new_id
from toolproxy.record.writer import SEGMENT_DIR
from toolproxy.testing.corpus import generate, generate_untagged

CLI = [sys.executable, "-m", "toolproxy.cli"]
TABLES = ("exchanges", "calls", "turns", "episodes", "runs")


def analyze(data: Path) -> str:
    proc = subprocess.run(
        [*CLI, "analyze", "--data", str(data), "--workers", "0"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def rows(db: Path) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in TABLES}
    finally:
        con.close()


def assert_same_as_fresh(data: Path, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    shutil.copytree(data / SEGMENT_DIR, fresh / SEGMENT_DIR)
    analyze(fresh)
    got, want = rows(default_db(data)), rows(default_db(fresh))
    for table in TABLES:
        assert len(got[table]) == len(want[table]), table
        assert got[table] == want[table], table


@pytest.fixture(scope="module")
def segments(tmp_path_factory) -> list[Path]:
    """The agents corpus (tagged runs of every stack, retries, one untagged run) in 8 segments;
    episodes run across segment boundaries."""
    data = tmp_path_factory.mktemp("corpus")
    generate(data, 2400, segment_records=300)
    return sorted((data / SEGMENT_DIR).iterdir())


def deliver(data: Path, files: list[Path], rename=lambda name: name) -> None:
    (data / SEGMENT_DIR).mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, data / SEGMENT_DIR / rename(f.name))


def test_later_segments_then_a_late_middle_one(segments: list[Path], tmp_path: Path):
    data = tmp_path / "data"
    deliver(data, segments[:3])
    analyze(data)
    deliver(data, segments[4:6])
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "a")
    deliver(data, [segments[3]])  # older than what is derived, inside episodes already derived
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "b")
    deliver(data, segments[6:])
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "c")


def test_replicas_segments_out_of_order(segments: list[Path], tmp_path: Path):
    """Every other segment from a second replica, delivered after the first replica's later ones."""
    data = tmp_path / "data"

    def replica(name: str) -> str:
        number = int(name.rsplit("-", 1)[1].split(".")[0])
        return name.replace(".jsonl", f"-{'east' if number % 2 else 'west'}.jsonl")

    deliver(data, segments[0::2][:2], replica)
    analyze(data)
    deliver(data, segments[1::2][:3], replica)
    analyze(data)
    deliver(data, segments[0::2][2:] + segments[1::2][3:], replica)
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "fresh")


def split_at_midnight(files: list[Path]) -> tuple[float, list[dict], list[dict]]:
    """The records of these segments and a midnight half of them are after: (midnight, before, after)."""
    records = [orjson.loads(line) for f in files for line in f.read_bytes().splitlines()]
    midnight = sorted(r["started_at"] for r in records)[len(records) // 2]
    return (
        midnight,
        [r for r in records if r["started_at"] < midnight],
        [r for r in records if r["started_at"] >= midnight],
    )


def write_daily(path: Path, records: list[dict], midnight: float, untagged_too: bool = False) -> None:
    """The records as `serve --run prod-%Y-%m-%d` writes them: their run is their day's (for records
    that named no run, only with `untagged_too`)."""
    with open(path, "wb") as f:
        for r in records:
            day = "prod-2026-11-29" if r["started_at"] < midnight else "prod-2026-11-30"
            f.write(orjson.dumps(dict(r, run=day if r.get("run") or untagged_too else None)) + b"\n")


def test_a_conversation_crossing_a_run_boundary(segments: list[Path], tmp_path: Path):
    """Daily runs (serve --run prod-%Y-%m-%d): records after a midnight go to the next day's run,
    so episodes that were open at midnight continue there; a late record of the first day comes last."""
    data = tmp_path / "data"
    (data / SEGMENT_DIR).mkdir(parents=True)
    midnight, first, second = split_at_midnight(segments[:4])
    write_daily(data / SEGMENT_DIR / "20261129T000000-1-0001.jsonl", first[:-5], midnight)
    analyze(data)
    write_daily(data / SEGMENT_DIR / "20261130T000000-1-0001.jsonl", second, midnight)
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "a")
    write_daily(data / SEGMENT_DIR / "20261130T000000-1-0002.jsonl", first[-5:], midnight)
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "b")


@pytest.fixture(scope="module")
def untagged(tmp_path_factory) -> list[Path]:
    """Traffic nobody tagged (one run, episodes reconstructed by chaining), 8 conversations at a
    time, in 9 segments: a segment continues conversations of the ones before it, and some start
    conversations of their own."""
    data = tmp_path_factory.mktemp("untagged")
    generate_untagged(data, 900, segment_records=100, concurrent=8)
    return sorted((data / SEGMENT_DIR).iterdir())


def episodes_in_part(out: str, runs: int) -> int:
    found = re.search(rf"derived in part: {runs} of those runs, only their (\d+) episodes with new records", out)
    assert found, out
    return int(found[1])


def test_untagged_conversations_continued_and_started_by_later_segments(untagged: list[Path], tmp_path: Path):
    data = tmp_path / "data"
    deliver(data, untagged[:3])
    analyze(data)
    for k, batch in enumerate((untagged[3:5], untagged[5:6], untagged[6:])):
        deliver(data, batch)
        out = analyze(data)
        con = duckdb.connect(str(default_db(data)), read_only=True)
        total = con.execute("SELECT count(*) FROM episodes").fetchone()[0]
        con.close()
        assert 0 < episodes_in_part(out, 1) < total
        assert_same_as_fresh(data, tmp_path / str(k))


def test_untagged_records_older_than_derived_ones_derive_the_run_whole(untagged: list[Path], tmp_path: Path):
    """A late segment's records could take continuations derived records had: the run is derived
    whole, and the next segment in order is derived in part again."""
    data = tmp_path / "data"
    deliver(data, untagged[:3] + untagged[4:5])
    analyze(data)
    deliver(data, untagged[3:4])
    out = analyze(data)
    assert "derived in part" not in out
    assert_same_as_fresh(data, tmp_path / "a")
    deliver(data, untagged[5:6])
    episodes_in_part(analyze(data), 1)
    assert_same_as_fresh(data, tmp_path / "b")


def test_an_untagged_run_derived_before_its_keys_were_kept_is_derived_whole_once(untagged: list[Path], tmp_path: Path):
    """A database analysed before schema step 8 has no episode_keys: the next analyze cannot know
    which conversations new records join, derives the run whole and keeps its keys from then on."""
    data = tmp_path / "data"
    deliver(data, untagged[:3])
    analyze(data)
    con = duckdb.connect(str(default_db(data)))
    con.execute("DELETE FROM episode_keys")
    con.close()
    deliver(data, untagged[3:4])
    assert "derived in part" not in analyze(data)
    assert_same_as_fresh(data, tmp_path / "a")
    deliver(data, untagged[4:5])
    episodes_in_part(analyze(data), 1)
    assert_same_as_fresh(data, tmp_path / "b")


def test_an_untagged_conversation_crossing_a_run_boundary(untagged: list[Path], tmp_path: Path):
    """Daily runs of untagged traffic: conversations open at midnight go on in the next day's run,
    where they start episodes of their own; late records of both days are derived in part."""
    data = tmp_path / "data"
    (data / SEGMENT_DIR).mkdir(parents=True)
    midnight, first, second = split_at_midnight(untagged[:6])
    write_daily(data / SEGMENT_DIR / "20261129T000000-1-0001.jsonl", first[:-20], midnight, untagged_too=True)
    analyze(data)
    write_daily(data / SEGMENT_DIR / "20261130T000000-1-0001.jsonl", second[:-20], midnight, untagged_too=True)
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "a")
    write_daily(
        data / SEGMENT_DIR / "20261130T000000-1-0002.jsonl", first[-20:] + second[-20:], midnight, untagged_too=True
    )
    episodes_in_part(analyze(data), 2)
    assert_same_as_fresh(data, tmp_path / "b")


def test_only_the_episodes_with_new_attempts_are_derived_again(segments: list[Path], tmp_path: Path):
    """The tagged runs one clock recorded are derived in part, only in the episodes whose tags the
    new segment names; the untagged run too, only in the conversations its new attempts continue
    or start."""
    data = tmp_path / "data"
    deliver(data, segments[:6])
    analyze(data)
    deliver(data, segments[6:7])
    out = analyze(data)
    new = list(map(orjson.loads, segments[6].read_bytes().splitlines()))
    tags = {(r["run"], r["episode"]) for r in new if r.get("episode")}
    runs = {run for run, _ in tags}
    assert any(r.get("run") is None for r in new)
    conversations = episodes_in_part(out, len(runs) + 1) - len(tags)
    con = duckdb.connect(str(default_db(data)), read_only=True)
    total = con.execute(
        "SELECT count(*) FROM episodes WHERE run IN (SELECT unnest(?::VARCHAR[]))", [sorted(runs)]
    ).fetchone()[0]
    untagged = con.execute("SELECT count(*) FROM episodes WHERE run = '(untagged)'").fetchone()[0]
    con.close()
    assert len(tags) < total / 3
    assert 0 < conversations < untagged / 2
    assert_same_as_fresh(data, tmp_path / "fresh")


def test_attempts_an_interrupted_analyze_left_underived_are_derived_by_the_next(segments: list[Path], tmp_path: Path):
    """An analyze stores records in transactions as it reads and derives at the end; killed in
    between, it leaves stored attempts with no turn. The next analyze, with nothing new to read,
    derives them, in part."""
    data = tmp_path / "data"
    deliver(data, segments[:4])
    analyze(data)
    con = duckdb.connect(str(default_db(data)))
    lost = con.execute(
        "SELECT DISTINCT turn_id FROM exchanges WHERE segment = ? AND run IN ('vllm-hermes', '(untagged)')",
        [segments[3].name],
    ).fetchall()
    con.execute("DELETE FROM turns WHERE turn_id IN (SELECT unnest(?::VARCHAR[]))", [[t for (t,) in lost]])
    con.execute(
        "UPDATE exchanges SET turn_id = NULL WHERE segment = ? AND run IN ('vllm-hermes', '(untagged)')",
        [segments[3].name],
    )
    con.close()
    out = analyze(data)
    assert "new exchanges: 0" in out and "runs re-derived: 2 ((untagged), vllm-hermes)" in out
    assert "derived in part: 2 of those runs" in out
    assert_same_as_fresh(data, tmp_path / "fresh")


def test_an_untagged_run_whose_new_records_repeat_stored_ones_is_derived_whole(untagged: list[Path], tmp_path: Path):
    """A segment that begins with copies of stored records (a replica's re-send, a copied file):
    the copies are dropped, but the new requests after them resumed their walks and stored only
    the links back they add, so an in-part derive, which reads the links of the new rows alone,
    would miss the conversations they continue; the run is derived whole, as a fresh analyze does."""
    data = tmp_path / "data"
    deliver(data, untagged[:3])
    analyze(data)
    copies = untagged[2].read_bytes().splitlines(keepends=True)[-30:]
    (data / SEGMENT_DIR / untagged[3].name).write_bytes(b"".join(copies) + untagged[3].read_bytes())
    out = analyze(data)
    assert "duplicates skipped: 30" in out
    assert "derived in part" not in out
    assert_same_as_fresh(data, tmp_path / "a")
    deliver(data, untagged[4:5])
    episodes_in_part(analyze(data), 1)
    assert_same_as_fresh(data, tmp_path / "b")


def responses_chain(conversations: int, turns: int) -> list[list[bytes]]:
    """Untagged Responses traffic, each request after the first chained to the one before by
    `previous_response_id` (server-side state, the input only the new message): per turn, the
    record lines of every conversation."""
    lines: list[list[bytes]] = [[] for _ in range(turns)]
    for c in range(conversations):
        previous = None
        for turn in range(turns):
            body = {"model": "gpt-test", "input": f"conversation {c} turn {turn}"}
            if previous:
                body["previous_response_id"] = previous
            previous = f"resp_{c}_{turn}"
            reply = {
                "id": previous,
                "object": "response",
                "status": "completed",
                "model": "gpt-test",
                "output": [
                    {
                        "type": "message",
                        "id": f"msg_{c}_{turn}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": f"answer {c}.{turn}", "annotations": []}],
                    }
                ],
            }
            t = 1764000000.0 + 10 * turn + c / 100
            rec = Record(
                id=new_id(),
                started_at=t,
                upstream="http://127.0.0.1:8000",
                method="POST",
                path="/v1/responses",
                client_path="/v1/responses",
                status=200,
                client_status=200,
                response_complete=True,
            )
            req = orjson.dumps(body)
            rec.request_headers = [["Content-Type", "application/json"]]
            rec.request_body, rec.request_body_encoding = encode_body(req)
            rec.request_body_size = len(req)
            rec.response_headers = [["content-type", "application/json"]]
            rec.response_body, rec.response_body_encoding = encode_body(orjson.dumps(reply))
            rec.ttfb_ms = rec.duration_ms = 500.0
            rec.ended_at = t + 0.5
            lines[turn].append(orjson.dumps(rec))
    return lines


def test_responses_chained_by_id_across_analyses(tmp_path: Path):
    """Requests continuing a stored response by id are linked to it when they arrive after it,
    in part (only the exchanges stored since the last analyze are looked at), and when the
    response arrives after the request that names it (a late segment), across the run."""
    turns = responses_chain(4, 4)
    data = tmp_path / "data"
    (data / SEGMENT_DIR).mkdir(parents=True)

    def write(name: str, *turn_numbers: int) -> None:
        (data / SEGMENT_DIR / name).write_bytes(b"".join(line + b"\n" for k in turn_numbers for line in turns[k]))

    write("20261129T000000-1-0001.jsonl", 0)
    analyze(data)
    write("20261129T000000-1-0002.jsonl", 1)
    analyze(data)
    con = duckdb.connect(str(default_db(data)), read_only=True)
    linked = con.execute(
        "SELECT count(*) FROM exchanges WHERE len(parent_hashes) > 0 AND record->>'previous_response_id' IS NOT NULL"
    ).fetchone()[0]
    con.close()
    assert linked == 4
    assert_same_as_fresh(data, tmp_path / "a")
    write("20261129T000000-1-0004.jsonl", 3)
    analyze(data)
    write("20261129T000000-1-0003.jsonl", 2)  # the responses turn 3 continues, after it
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "b")


def rewritten(src: Path, dst: Path, change) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(
        b"".join(orjson.dumps(change(orjson.loads(line))) + b"\n" for line in src.read_bytes().splitlines())
    )


def other_model(rec: dict) -> dict:
    for body in ("request_body", "response_body"):
        if rec.get(body) and rec.get(f"{body}_encoding") == "utf8":
            rec[body] = re.sub(r'"model":"[^"]*"', '"model":"other-model"', rec[body])
    return dict(rec, condition="ablated")


def test_runs_rows_follow_new_records(segments: list[Path], tmp_path: Path):
    """A run's row (its exchanges' count and times, most common model, conditions) is brought up to
    date from the new records where they are all new attempts, and aggregated over the run where
    not: the most common model changes over the re-analyses, a condition is added, a record older
    than its run's first arrives, an exchange that is not an attempt comes, and the tallies of a store
    analysed before storage step 11 are missing."""
    data = tmp_path / "data"
    deliver(data, segments[:3])
    analyze(data)
    con = duckdb.connect(str(default_db(data)), read_only=True)
    before = dict(con.execute("SELECT run, model FROM runs").fetchall())
    con.close()
    for k in (3, 4):
        rewritten(segments[k], data / SEGMENT_DIR / segments[k].name, other_model)
        analyze(data)
        assert_same_as_fresh(data, tmp_path / str(k))
    first = orjson.loads(segments[0].read_bytes().splitlines()[0])
    older = dict(first, id=new_id(), started_at=first["started_at"] - 100, ended_at=first["ended_at"] - 100)
    listing = dict(
        first,
        id=new_id(),
        method="GET",
        path="/v1/models",
        client_path="/v1/models",
        request_body=None,
        request_body_size=0,
        response_body='{"object":"list","data":[]}',
        response_headers=[["content-type", "application/json"]],
    )
    (data / SEGMENT_DIR / "20991231T000000-1-0001.jsonl").write_bytes(orjson.dumps(older) + b"\n")
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "older")
    (data / SEGMENT_DIR / "20991231T000000-1-0002.jsonl").write_bytes(orjson.dumps(listing) + b"\n")
    analyze(data)
    assert_same_as_fresh(data, tmp_path / "listing")
    con = duckdb.connect(str(default_db(data)))
    assert con.execute("SELECT count(*) FROM exchanges WHERE NOT is_attempt").fetchone()[0] == 1
    con.execute("DELETE FROM run_tallies")
    con.close()
    for k in (5, 6):
        rewritten(segments[k], data / SEGMENT_DIR / segments[k].name, other_model)
        analyze(data)
        assert_same_as_fresh(data, tmp_path / str(k))
    con = duckdb.connect(str(default_db(data)), read_only=True)
    after = dict(con.execute("SELECT run, model FROM runs").fetchall())
    conditions = {c for (c,) in con.execute("SELECT DISTINCT condition FROM runs").fetchall()}
    con.close()
    assert any(after[run] == "other-model" != model for run, model in before.items())
    assert "ablated,native" in conditions


def sampled_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("sampled ("))


def test_the_sampled_runs_line_after_re_analyses(segments: list[Path], tmp_path: Path):
    """Runs recorded with --sample: analyze's line about them (the rate, the exchanges only a stub
    stands for) after re-analyses, with and without new stubs, is a fresh analyze's."""

    def sampled(rec: dict) -> dict:
        return dict(rec, extra={"sample": {"rate": 0.5, "by": "episode"}})

    def stubbed(rec: dict) -> dict:
        rec = sampled(rec)
        return dict(
            rec, kind="sampled_out", request_body=None, response_body=None, request_headers=[], response_headers=[]
        )

    data = tmp_path / "data"
    for k in range(3):
        rewritten(segments[k], data / SEGMENT_DIR / segments[k].name, sampled)
    analyze(data)
    lines = segments[3].read_bytes().splitlines(keepends=True)
    stubs = segments[3].with_name("stubs-" + segments[3].name)
    stubs.write_bytes(b"".join(lines[:5]))
    rewritten(stubs, data / SEGMENT_DIR / segments[3].name, stubbed)
    for k in (4, 5):
        rewritten(segments[k], data / SEGMENT_DIR / segments[k].name, sampled)
        out = analyze(data)
        fresh = tmp_path / f"fresh{k}"
        shutil.copytree(data / SEGMENT_DIR, fresh / SEGMENT_DIR)
        assert sampled_line(out) == sampled_line(analyze(fresh))
        assert sum(map(int, re.findall(r"(\d+) exchanges forwarded and not stored", sampled_line(out)))) == 5
    assert "derived in part" in out
    assert_same_as_fresh(data, tmp_path / "rows")
