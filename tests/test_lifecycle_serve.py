"""`serve --max-disk` and `serve --retain` held by a real proxy under concurrent load."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp

from toolproxy.record.retention import LEDGER, closed_segments, read_ledger
from toolproxy.record.segments import list_segments, read_records

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
    deadline = time.monotonic() + 5  # group commit: `written` counts a record once its fsync is done
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
    left = [int(json.loads(r["request_body"])["messages"][0]["content"].split()[1]) for r in read_records(p.data, "exchange")]
    assert len(set(left)) == len(left) and 0 < len(left) < n and max(left) >= n - 16
    pruned = read_ledger(p.data)
    assert len(pruned) == lifecycle["pruned_segments"]
    assert not pruned & {s.name for s in list_segments(p.data)}


async def test_disk_budget_block_refuses_with_503_and_resumes_after_prune(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--segment-size", str(SEGMENT), "--max-disk", str(BUDGET),
              "--on-disk-full", "block", "--durability", "sync")
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
    # The refusals are recorded too: every exchange, served or not, is on disk.
    assert len(read_records(p.data, "exchange")) == len(statuses) + 1

    t = time.time() - 3600
    for seg in list_segments(p.data):
        os.utime(seg, (t, t))
    r = subprocess.run([sys.executable, "-c", "from toolproxy.cli import main; main()", "prune", "--older-than", "1m",
                        "--data", str(p.data)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 5
    while p.stats()["lifecycle"]["refusing"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json=body(1)) as r:
            assert r.status == 200


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
    r = subprocess.run([sys.executable, "-c", "from toolproxy.cli import main; main()", "serve", "--upstream",
                        "http://127.0.0.1:9", "--data", str(tmp_path), "--max-disk", "1MB"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "less than two segments" in r.stderr and "Traceback" not in r.stderr
