"""`serve --max-disk` and `serve --retain` held by a real proxy under concurrent load."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp

from toolproxy.proxy import refusals
from toolproxy.record.retention import LEDGER, closed_segments, read_ledger
from toolproxy.record.segments import list_segments, read_records, read_segment

BUDGET = 512 * 1024
SEGMENT = 32 * 1024


def body(i: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": f"request {i:05d} " + "x" * 1500}]}


async def load(url: str, n: int, concurrency: int, watch, statuses: list[int]) -> None:
    """n requests, `concurrency` at a time, calling watch() between them."""
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as s:

        async def one(i: int) -> None:
            async with sem:
                async with s.post(url + "/v1/chat/completions", json=body(i)) as r:
                    await r.read()
                    statuses.append(r.status)
                watch()

        await asyncio.gather(*(one(i) for i in range(n)))


async def test_disk_budget_prunes_the_oldest_and_counts_every_record(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--segment-size", str(SEGMENT), "--max-disk", str(BUDGET))
    peak = over = 0

    def watch() -> None:
        # The promise: within the budget, except for what segments took past their rotation size
        # (rotation is checked before each batch, and a writer catching up writes big batches).
        nonlocal peak, over
        segs = closed_segments(p.data)
        size = sum(s.size for s in segs)
        past_rotation = sum(max(0, s.size - SEGMENT) for s in segs)
        peak = max(peak, size)
        over = max(over, size - BUDGET - past_rotation)

    statuses: list[int] = []
    n = 1600  # ~2.5 MB of records: five times the budget
    await load(p.url, n, 16, watch, statuses)
    deadline = time.monotonic() + 120  # group commit: `written` counts a record once its fsync is done
    while (stats := p.stats()["recording"])["written"] < n and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    lifecycle = p.stats()["lifecycle"]
    assert p.stop() == 0
    assert statuses == [200] * n
    assert stats["dropped"] == 0 and stats["written"] == n
    assert lifecycle["pruned_segments"] >= 5 and lifecycle["pruned_bytes"] > 3 * BUDGET
    print(f"peak {peak} bytes of segments under a budget of {BUDGET}")
    assert over <= 0, (over, peak)
    assert peak > BUDGET // 2
    # What is left is the newest records; what went is in the ledger.
    left = [
        int(json.loads(r["request_body"])["messages"][0]["content"].split()[1])
        for r in read_records(p.data, "exchange")
    ]
    assert len(set(left)) == len(left) and 0 < len(left) < n and max(left) >= n - 16
    pruned = read_ledger(p.data)
    assert len(pruned) == lifecycle["pruned_segments"]
    assert not pruned & {s.name for s in list_segments(p.data)}


async def test_disk_budget_block_refuses_with_503_and_resumes_after_prune(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    p = proxy(
        fake.url,
        "--quiet",
        "--no-fingerprint",
        "--segment-size",
        str(SEGMENT),
        "--max-disk",
        str(BUDGET),
        "--on-disk-full",
        "block",
        "--durability",
        "sync",
    )
    statuses: list[int] = []
    while 503 not in statuses and len(statuses) < 3000:
        await load(p.url, 100, 8, lambda: None, statuses)
    assert statuses.count(200) >= 100 and statuses[-1] == 503
    assert p.stats()["lifecycle"]["segment_bytes"] >= BUDGET  # refused at the budget, not before
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json=body(0)) as r:
            assert r.status == 503
            message = (await r.json())["error"]["message"]
    assert "disk budget" in message and "toolproxy prune" in message
    assert not (p.data / LEDGER).exists()
    assert p.stats()["lifecycle"]["refusing"] is True
    assert p.stats()["recording"]["dropped"] == 0
    # Every exchange served is on disk; every refusal is counted, and recorded within the refusal
    # budget, in segments the budget does not count.
    refused = statuses.count(503) + 1
    deadline = time.monotonic() + 120
    while True:
        stats = p.stats()["refused"]
        recs = read_records(p.data, "exchange")
        if len(recs) == statuses.count(200) + stats["recorded"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert stats["by_kind"] == {"disk_budget_full": refused}
    assert stats["recorded"] + stats["not_recorded"] == refused and stats["recorded"] >= 1
    assert sorted(r["client_status"] for r in recs) == [200] * statuses.count(200) + [503] * stats["recorded"]
    assert all(
        seg.name.endswith(".refused.jsonl")
        for seg in list_segments(p.data)
        if any(line.record and line.record.get("error_kind") for line in read_segment(seg))
    )

    t = time.time() - 3600
    for seg in list_segments(p.data):
        os.utime(seg, (t, t))
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "prune",
            "--older-than",
            "1m",
            "--data",
            str(p.data),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 120
    while p.stats()["lifecycle"]["refusing"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json=body(1)) as r:
            assert r.status == 200


async def test_disk_budget_block_holds_against_clients_retrying_hard(fake_stack, proxy):
    """`block` bounds the disk: the budget is charged before each write (refusing starts at the
    append that reaches it, not at the next scan), the exchanges already in flight may take it
    at most a segment past, and the 503s of clients retrying at once are counted, recorded only
    within the refusals' own small cap."""
    fake = fake_stack("llamacpp")
    p = proxy(
        fake.url,
        "--quiet",
        "--no-fingerprint",
        "--segment-size",
        str(SEGMENT),
        "--max-disk",
        str(BUDGET),
        "--on-disk-full",
        "block",
    )
    # As docs/lifecycle.md#disk-budget says: a segment past the budget for exchanges in flight, the refusals' own
    # cap, and a record past the size of each segment written meanwhile.
    bound = BUDGET + SEGMENT + (refusals.KEEP + 1) * refusals.segment_bytes(SEGMENT) + (refusals.KEEP + 2) * 16 * 1024
    statuses: list[int] = []
    peak = 0
    end = time.monotonic() + 2.5

    async def client(s: aiohttp.ClientSession, c: int) -> None:
        i = 0
        while time.monotonic() < end:  # a 503 is retried at once
            async with s.post(p.url + "/v1/chat/completions", json=body(c * 100_000 + i)) as r:
                await r.read()
                statuses.append(r.status)
            i += 1

    async def watch() -> None:
        nonlocal peak
        while time.monotonic() < end + 1.0:
            peak = max(peak, sum(seg.size for seg in closed_segments(p.data)))
            await asyncio.sleep(0.005)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as s:
        await asyncio.gather(watch(), *(client(s, c) for c in range(16)))
    served, refused = statuses.count(200), statuses.count(503)
    print(
        f"peak {peak} bytes of segments under a budget of {BUDGET} (bound {bound}); {served} served, {refused} refused"
    )
    assert served + refused == len(statuses) and refused > 1000, (served, refused)
    assert peak <= bound, (peak, bound)
    stats = p.stats()
    assert stats["lifecycle"]["refusing"] and stats["refused"]["by_kind"] == {"disk_budget_full": refused}
    # Every exchange served is on disk or counted dropped (past the budget by more than a segment).
    lost = stats["recording"]["dropped_reasons"].get("disk_budget", 0)
    assert stats["recording"]["dropped"] == lost and stats["recording"]["written"] == served - lost
    assert len([r for r in read_records(p.data, "exchange") if r["client_status"] == 200]) == served - lost


async def test_retain_deletes_aged_segments_while_serving(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--segment-size", "1", "--durability", "sync", "--retain", "2s")
    statuses: list[int] = []
    await load(p.url, 6, 1, lambda: None, statuses)
    first = {s.name for s in list_segments(p.data)}
    assert len(first) >= 5
    await asyncio.sleep(3.5)
    await load(p.url, 1, 1, lambda: None, statuses)
    left = {s.name for s in list_segments(p.data)}
    assert statuses == [200] * 7
    assert first - left and read_ledger(p.data) == first - left
    assert len(left - first) == 1  # the newest record's segment stays


def test_budget_smaller_than_two_segments_is_a_usage_error(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--data",
            str(tmp_path),
            "--max-disk",
            "1MB",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "less than two segments" in r.stderr and "Traceback" not in r.stderr
