"""Durability: what reaches disk, when, and what survives a crash or a failing disk."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time

import aiohttp
import pytest

from toolproxy.emulators import raw, stall, text
from toolproxy.record.segments import list_segments, read_segment
from toolproxy.record.writer import MAX_QUEUE_WAIT

MSGS = [{"role": "user", "content": "hi"}]


async def post(url: str, body: dict) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=body) as r:
            return r.status, await r.read()


async def test_sync_durability_record_is_on_disk_when_the_response_ends(fake_stack, proxy):
    fake = fake_stack("openai")
    # A long commit window: in group mode these records would sit in the buffer for 5 s.
    p = proxy(fake.url, "--quiet", "--durability", "sync", "--commit-window", "5")
    t0 = time.monotonic()
    for i in range(4):
        status, _ = await post(
            p.url + "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS, "stream": bool(i % 2)}
        )
        assert status == 200
        assert len(p.records()) == i + 1  # no waiting: it is already there
    assert time.monotonic() - t0 < 4  # each response waited for its own fsync, not for the window


async def test_sync_durability_covers_the_proxys_own_error_answers(proxy):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    p = proxy(dead, "--quiet", "--durability", "sync", "--commit-window", "5")
    status, _ = await post(p.url + "/v1/chat/completions", {"model": "m", "messages": MSGS})
    assert status == 502
    assert [r["error_kind"] for r in p.records()] == ["connect"]


async def test_group_durability_flushes_on_graceful_shutdown(fake_stack, proxy):
    fake = fake_stack("vllm", tool_parser="hermes")
    p = proxy(fake.url, "--quiet", "--commit-window", "5")
    for _ in range(3):
        assert (await post(p.url + "/v1/chat/completions", {"model": fake.model, "messages": MSGS}))[0] == 200
    assert p.stop() == 0
    assert len(p.records()) == 3


async def test_segments_rotate_by_size_and_stay_ordered(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet", "--segment-size", "4k", "--durability", "sync")
    for i in range(24):
        assert (
            await post(
                p.url + "/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": f"{i} " + "x" * 600}]},
            )
        )[0] == 200
    p.stop()
    segs = list_segments(p.data)
    assert len(segs) >= 4
    assert all(seg.stat().st_size >= 4096 for seg in segs[:-1])
    recs = p.records()
    assert [json.loads(r["request_body"])["messages"][0]["content"].split()[0] for r in recs] == [
        str(i) for i in range(24)
    ]
    assert [r["id"] for r in recs] == sorted(r["id"] for r in recs)
    assert all(line.error is None for seg in segs for line in read_segment(seg))


async def load_then_kill(
    p, workers: int, seconds: float, pad: str = "", until=None
) -> tuple[float, list[tuple[float, str]]]:
    """Clients post chat requests (every other one streamed) until the proxy is killed -9 after
    `seconds` (or once `until(finished)` returns). Returns when it was killed, and (when, marker) for
    every response received complete; a request's message is its marker (w<worker>-<n>, 9
    characters) followed by `pad`."""
    finished: list[tuple[float, str]] = []
    stop = asyncio.Event()

    async def worker(w: int) -> None:
        i = 0
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                marker = f"w{w:02d}-{i:05d}"
                i += 1
                body = {
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": marker + pad}],
                    "stream": bool(i % 2),
                }
                try:
                    async with s.post(
                        p.url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=10)
                    ) as r:
                        payload = await r.read()
                except (TimeoutError, aiohttp.ClientError):
                    continue
                if r.status == 200 and (not body["stream"] or payload.endswith(b"data: [DONE]\n\n")):
                    finished.append((time.monotonic(), marker))

    tasks = [asyncio.create_task(worker(w)) for w in range(workers)]
    await asyncio.sleep(seconds)
    if until is not None:
        await until(finished)
    killed_at = time.monotonic()
    p.kill()
    await asyncio.sleep(0.2)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 15)
    return killed_at, finished


def _break_recording(data) -> None:
    """Replace the segment directory by a plain file: every later open fails, even for root."""
    seg_dir = data / "segments"
    shutil.rmtree(seg_dir)
    seg_dir.write_bytes(b"")


async def test_recording_failure_keeps_serving_and_reports_degraded(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--commit-window", "0.05", "--no-fingerprint")  # exactly 3 records dropped
    _break_recording(p.data)
    for _ in range(3):
        assert (await post(p.url + "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS}))[0] == 200
    for _ in range(100):
        status, health = p.health()
        if health["recording"]["dropped"] >= 3:
            break
        await asyncio.sleep(0.02)
    assert status == 503 and health["status"] == "degraded"
    assert health["recording"]["dropped"] == 3 and health["recording"]["last_error"]
    for _ in range(250):  # printed before the count moved, but read from the pipe by a thread of ours
        if "RECORDING FAILED" in p.output():
            break
        await asyncio.sleep(0.02)
    assert "RECORDING FAILED" in p.output()


async def test_recording_failure_with_block_answers_503(fake_stack, proxy):
    fake = fake_stack("openai")
    # No fingerprint record: it could be the write that discovers the failure, before this exchange.
    p = proxy(fake.url, "--quiet", "--on-record-failure", "block", "--durability", "sync", "--no-fingerprint")
    _break_recording(p.data)
    with pytest.raises(aiohttp.ClientPayloadError):  # the exchange that discovers the failure is cut short,
        await post(p.url + "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS})  # never a clean 200
    second = await post(p.url + "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS})
    assert second[0] == 503 and json.loads(second[1])["error"]["code"] == "recording_unavailable"
    assert len(fake.seen) <= 1


def test_unusable_data_dir_is_refused_at_start(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "segments").write_bytes(b"")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--port",
            "0",
            "--data",
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "segments" in r.stderr and "Traceback" not in r.stderr


async def test_kill_9_under_load_then_restart(fake_stack, proxy):
    """Sync durability: every response a client fully received has its record; no segment is corrupt."""
    fake = fake_stack("openai")
    fake.responder = lambda req: text("reply to " + req.messages[-1]["content"] + " with some words in it")
    fake.inject(stall(between=0.003, times=None))
    p = proxy(fake.url, "--quiet", "--durability", "sync")
    data = p.data
    _, finished = await load_then_kill(p, workers=16, seconds=1.5)
    complete = [marker for _, marker in finished]
    assert len(complete) > 20

    lines = [line for seg in list_segments(data) for line in read_segment(seg)]
    assert not [ln for ln in lines if ln.error and ln.error != "torn_tail"], "a complete line is corrupt"
    torn = [ln for ln in lines if ln.error == "torn_tail"]
    assert all(ln.end == ln.path.stat().st_size for ln in torn)  # a torn line can only be the very end of a file
    recorded = {
        json.loads(ln.record["request_body"])["messages"][0]["content"]
        for ln in lines
        if ln.record and ln.record.get("kind", "exchange") == "exchange"
    }
    missing = set(complete) - recorded
    assert not missing, f"{len(missing)} fully received responses have no record: {sorted(missing)[:5]}"

    # A crash mid-write leaves a partial line; simulate the worst case and restart on the same dir.
    last = list_segments(data)[-1]
    with open(last, "ab") as f:
        f.write(b'{"id":"01TORN","kind":"exchange","v":1,"request_bo')
    before = len(p.records())  # p is dead; its data dir is what p2 will reuse
    p2 = proxy(fake.url, "--quiet", "--durability", "sync", data=data)
    assert (await post(p2.url + "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS}))[0] == 200
    p2.stop()
    lines = [line for seg in list_segments(data) for line in read_segment(seg)]
    assert [ln.path for ln in lines if ln.error] == [last] and lines[-1].record is not None
    assert len(p2.records()) == before + 1


async def test_group_mode_loss_bound_on_kill_9_under_load(fake_stack, proxy):
    """Group durability: a crash of the proxy loses no record of a response that finished more than
    MAX_QUEUE_WAIT (0.1 s) before it, the bound docs/record.md#durability-what-is-guaranteed states, however long
    the commit window."""
    # A long window, so the bound is seen to depend on the writer's queue, not on the fsync cadence
    # (it used to: records sat in a userspace buffer until the next fsync).
    window = 2.0
    fake = fake_stack("openai")
    fake.responder = lambda req: text("reply to " + req.messages[-1]["content"][:9] + " with some words in it")
    fake.inject(stall(between=0.002, times=None))
    p = proxy(fake.url, "--commit-window", str(window))  # a log line per exchange: work for the writer
    killed_at, finished = await load_then_kill(p, workers=6, seconds=3.0, pad=" hello" * 100)
    assert len(finished) > 50

    recorded = {json.loads(r["request_body"])["messages"][0]["content"][:9] for r in p.records()}
    lost = sorted((round(killed_at - t, 3), m) for t, m in finished if m not in recorded)
    too_old = [(age, m) for age, m in lost if age > MAX_QUEUE_WAIT]
    assert not too_old, (
        f"{len(too_old)} of {len(finished)} responses that finished more than {MAX_QUEUE_WAIT}s "
        f"before the kill have no record; oldest: {too_old[-5:]}"
    )


HUGE = 256 * 1024 * 1024


def segment_bytes(data) -> int:
    return sum(seg.stat().st_size for seg in list_segments(data))


async def test_group_mode_loss_bound_holds_with_a_huge_spilled_body_in_the_batch(fake_stack, proxy):
    """A record with a body spilled past --spill-above takes longer to copy into its segment than
    the bound: no smaller exchange's record waits behind it, and its own response waits for it.
    Killed -9 while it is being copied, the proxy has lost no record of a response answered more
    than MAX_QUEUE_WAIT before."""
    fake = fake_stack("openai")
    fake.responder = lambda req: text("reply to " + req.messages[-1]["content"][:9] + " with some words in it")
    # 4-byte characters, the slowest text to copy into a JSON line: the copy lasts long enough
    # (0.9 s here) to be caught under way.
    fake.inject(raw("\U0001f600".encode() * (HUGE // 4), path="/v1/huge"), stall(between=0.002, times=None))
    p = proxy(fake.url, "--commit-window", "2")

    async def huge(finished: list) -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(p.url + "/v1/huge", timeout=aiohttp.ClientTimeout(total=60)) as r:
                size = 0
                async for piece in r.content.iter_any():
                    size += len(piece)
        if size == HUGE:
            finished.append((time.monotonic(), "huge"))

    async def during_the_copy(finished: list) -> None:
        """Until the huge record's copy into its segment is well under way."""
        asyncio.create_task(huge(finished))
        base = segment_bytes(p.data)
        deadline = time.monotonic() + 60
        while segment_bytes(p.data) < base + HUGE // 64:
            assert time.monotonic() < deadline, "the huge record was never written"
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)

    killed_at, finished = await load_then_kill(p, workers=4, seconds=0.5, until=during_the_copy)
    recs = p.records()
    assert not any(r["path"] == "/v1/huge" for r in recs), "the copy ended before the kill: nothing was tested"
    assert len(finished) > 20
    recorded = {json.loads(r["request_body"])["messages"][0]["content"][:9] for r in recs if r["path"] != "/v1/huge"}
    lost = sorted((round(killed_at - t, 3), m) for t, m in finished if m not in recorded)
    too_old = [(age, m) for age, m in lost if age > MAX_QUEUE_WAIT]
    assert not too_old, (
        f"{len(too_old)} of {len(finished)} responses that finished more than {MAX_QUEUE_WAIT}s "
        f"before the kill have no record; oldest: {too_old[-5:]}"
    )
