"""`toolproxy prune` against segments a real proxy recorded, and `analyze` before and after.

The proxy rotates segments after every record (--segment-size 1, sync durability), so episodes
span segments; ageing some segments by their mtime makes a cut through the middle of episodes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import duckdb
import pytest

from toolproxy.record.retention import LEDGER, PRUNING_SUFFIX, read_ledger
from toolproxy.record.segments import list_segments, read_segment

DAY = 86400


def tp(*args):
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def converse(base: str, opener: str, turns: int) -> None:
    """A conversation whose every turn resends the history so far (one record per turn)."""
    messages = [{"role": "user", "content": opener}]
    for _ in range(turns):
        reply = post(base + "/v1/chat/completions", {"model": "m", "messages": messages})
        messages.append(reply["choices"][0]["message"])
        messages.append({"role": "user", "content": f"and then? ({len(messages)})"})


def snapshot(data) -> dict:
    """The derived state that must agree, without timestamps."""
    from toolproxy.analysis.store.connection import connect

    con = connect(data / "toolproxy.duckdb", read_only=True)
    try:
        return {
            name: con.execute(query).fetchall()
            for name, query in {
                "exchanges": "SELECT id, run, episode, turn_id FROM exchanges ORDER BY id",
                "turns": "SELECT turn_id, run, episode_key, turn_index, outcome, role, is_last FROM turns ORDER BY "
                "turn_id",
                "episodes": "SELECT episode_key, run, episode, reconstructed, n_turns FROM episodes ORDER BY "
                "episode_key",
                "runs": "SELECT run, n_exchanges, n_episodes, n_turns FROM runs ORDER BY run",
                "ingest": "SELECT segment, byte_offset FROM ingest_state ORDER BY segment",
                "tool_sets": "SELECT hash FROM tool_sets ORDER BY hash",
            }.items()
        }
    finally:
        con.close()


def age(paths, days: float) -> None:
    t = time.time() - days * DAY
    for p in paths:
        os.utime(p, (t, t))


@pytest.fixture
def recording(fake_stack, proxy, tmp_path):
    """Two tagged runs and untagged traffic, one record per segment, proxy stopped."""
    p = proxy(
        fake_stack("llamacpp").url,
        "--quiet",
        "--no-fingerprint",
        "--segment-size",
        "1",
        "--durability",
        "sync",
        data=tmp_path / "recorded",
    )
    for ep in range(3):
        converse(f"{p.url}/t/run=alpha/episode={ep}", f"alpha {ep}", 3)
    converse(f"{p.url}/t/run=beta/episode=0", "beta", 2)
    converse(p.url, "untagged conversation", 3)
    assert p.stop() == 0
    return p.data


def test_prune_then_analyze_equals_a_fresh_analyze_of_what_remains(recording, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(recording, data)
    segs = list_segments(data)
    assert len(segs) == 14
    # Cut after the 5th record: alpha episode 1 loses its first two turns, keeps its third.
    old, young = segs[:5], segs[5:]
    age(old, 10)
    age(young, 1)
    assert tp("analyze", "--data", str(data)).returncode == 0
    before = snapshot(data)
    assert len(before["exchanges"]) == 14

    r = tp("prune", "--older-than", "7d", "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert "deleted 5 segments" in r.stdout
    assert "database: removed 5 exchanges from 5 segments; re-derived 1 runs" in r.stdout
    assert sorted(p.name for p in list_segments(data)) == [p.name for p in young]
    assert read_ledger(data) == {p.name for p in old}

    after_prune = snapshot(data)
    r = tp("analyze", "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert "new exchanges: 0" in r.stdout and "issues: none" in r.stdout and "pruned segments" not in r.stdout
    assert snapshot(data) == after_prune

    fresh = tmp_path / "fresh"
    shutil.copytree(data, fresh, ignore=shutil.ignore_patterns("*.duckdb*", LEDGER))
    assert tp("analyze", "--data", str(fresh)).returncode == 0
    assert snapshot(fresh) == after_prune
    # The straddling episode is rebuilt from its remaining turn, not dropped and not left stale.
    eps = {episode: n for _, run, episode, _, n in after_prune["episodes"] if run == "alpha"}
    assert eps == {"1": 1, "2": 3}
    assert {run: n for run, n, _, _ in after_prune["runs"]}["alpha"] == 4
    kept = {line.record["id"] for seg in young for line in read_segment(seg) if line.record}
    assert {x[0] for x in after_prune["exchanges"]} == kept


def test_prune_by_the_analyzer_when_the_database_was_busy(recording, tmp_path):
    """Segments pruned while the database could not be opened are dropped by the next analyze."""
    data = tmp_path / "data"
    shutil.copytree(recording, data)
    segs = list_segments(data)
    assert tp("analyze", "--data", str(data)).returncode == 0
    age(segs[:3], 10)
    age(segs[3:], 0)
    holder = duckdb.connect(str(data / "toolproxy.duckdb"))
    try:
        r = tp("prune", "--older-than", "1d", "--data", str(data))
    finally:
        holder.close()
    assert r.returncode == 0, r.stderr
    assert "deleted 3 segments" in r.stdout and "next `toolproxy analyze`" in r.stdout
    r = tp("analyze", "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert "pruned segments: 3; their 3 exchanges removed, 1 runs re-derived" in r.stdout
    snap = snapshot(data)
    assert len(snap["exchanges"]) == 11 and len(snap["ingest"]) == 11
    assert {run: n for run, n, _, _ in snap["runs"]}["alpha"] == 6


def test_dry_run_and_run_filter(recording, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(recording, data)
    segs = list_segments(data)
    age(segs, 30)
    r = tp("prune", "--older-than", "7d", "--data", str(data), "--dry-run")
    assert r.returncode == 0 and "would delete 14 segments" in r.stdout
    assert len(list_segments(data)) == 14 and not (data / LEDGER).exists()

    r = tp("prune", "--older-than", "7d", "--run", "beta", "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert "deleted 2 segments" in r.stdout
    left = list_segments(data)
    assert len(left) == 12
    assert not any(line.record["run"] == "beta" for seg in left for line in read_segment(seg))


def test_a_segment_a_shared_run_holds_is_kept_whole(recording, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(recording, data)
    segs = list_segments(data)
    # Two runs' records in one segment: a --run prune keeps it, an age prune takes it.
    segs[0].write_bytes(segs[0].read_bytes() + segs[-1].read_bytes())
    segs[-1].unlink()
    age(list_segments(data), 30)
    r = tp("prune", "--older-than", "7d", "--run", "alpha", "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert "deleted 8 segments" in r.stdout and "kept 1 segments that also hold other runs" in r.stdout
    assert segs[0].exists()


def test_a_live_segment_is_never_pruned_and_an_interrupted_prune_is_finished(fake_stack, proxy, tmp_path):
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--durability", "sync")
    converse(p.url, "live", 2)
    live = list_segments(p.data)
    assert len(live) == 1
    age(live, 30)
    r = tp("prune", "--older-than", "1d", "--data", str(p.data))
    assert r.returncode == 0, r.stderr
    assert "deleted 0 segments" in r.stdout and f"running proxy is writing: {live[0].name}" in r.stdout
    converse(p.url, "still recording", 1)
    assert len(p.records()) == 3

    p.stop()
    # A prune that crashed after hiding the segment: the next one logs and deletes it.
    hidden = live[0].with_name(live[0].name + PRUNING_SUFFIX)
    os.rename(live[0], hidden)
    r = tp("prune", "--older-than", "1d", "--data", str(p.data))
    assert r.returncode == 0, r.stderr
    assert "deleted 1 segments" in r.stdout
    assert not hidden.exists() and read_ledger(p.data) == {live[0].name}


def test_bad_duration_is_a_usage_error(tmp_path):
    (tmp_path / "segments").mkdir()
    r = tp("prune", "--older-than", "a week", "--data", str(tmp_path))
    assert r.returncode == 2 and "not a duration" in r.stderr and "Traceback" not in r.stderr
    r = tp("prune", "--older-than", "7d", "--data", str(tmp_path / "nope"))
    assert r.returncode == 2 and "holds no recordings" in r.stderr
