"""The writer under injected faults: real files in a temporary directory, and a writer whose
write or fsync system call fails the way a full or broken disk does."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time

import orjson
import pytest

from toolproxy.record import writer as writer_module
from toolproxy.record.masking import Masker, parse_rules
from toolproxy.record.model import Record, encode_record, new_id
from toolproxy.record.segments import list_segments, read_records, read_segment
from toolproxy.record.writer import SegmentWriter


class FaultyWriter(SegmentWriter):
    """Each queued fault is used by one write (or fsync) call: an exception to raise, optionally
    after writing part of the data first (what a disk filling up mid-write does)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.write_faults: list[tuple[float, BaseException]] = []
        self.fsync_faults: list[BaseException] = []
        self.fsync_gate = threading.Event()
        self.fsync_gate.set()
        self.write_gate = threading.Event()
        self.write_gate.set()
        self.writing = threading.Event()

    def _os_write(self, fd, data):
        self.writing.set()
        self.write_gate.wait()
        if self.write_faults:
            part, exc = self.write_faults.pop(0)
            if part:
                os.write(fd, bytes(data[: int(len(data) * part)]))
            raise exc
        return os.write(fd, data)

    def _os_fsync(self, fd):
        self.fsync_gate.wait()
        if self.fsync_faults:
            raise self.fsync_faults.pop(0)
        os.fsync(fd)


@pytest.fixture
def writer(tmp_path):
    made = []

    def make(**kwargs) -> FaultyWriter:
        kwargs.setdefault("window", 0.05)
        w = FaultyWriter(tmp_path, **kwargs)
        w.start()
        made.append(w)
        return w

    yield make
    for w in made:
        w.fsync_gate.set()
        w.write_gate.set()
        w.close()


def rec(i: int, **fields) -> Record:
    return Record(
        id=new_id(),
        started_at=time.time(),
        method="POST",
        path=f"/r{i}",
        request_body=f'{{"n": {i}}}',
        request_body_encoding="utf8",
        **fields,
    )


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def on_disk(tmp_path) -> list[str]:
    return [r["path"] for r in read_records(tmp_path)]


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def test_written_counts_records_only_once_an_fsync_covers_them(writer, tmp_path):
    w = writer()
    w.fsync_gate.clear()
    for i in range(3):
        w.submit(rec(i))
    await until(lambda: len(on_disk(tmp_path)) == 3)  # in the kernel: safe from a crash of the process
    await asyncio.sleep(0.2)
    assert w.stats.written == 0  # but not yet from a crash of the machine
    w.fsync_gate.set()
    await until(lambda: w.stats.written == 3)
    assert w.stats.dropped == 0 and not w.stats.degraded


async def test_a_write_that_fails_midway_counts_every_record_and_leaves_no_partial_line(writer, tmp_path):
    w = writer()
    assert await w.submit_and_wait(rec(0))
    w.write_faults = [(0.5, enospc())]
    waiters = [asyncio.ensure_future(w.submit_and_wait(rec(i))) for i in range(1, 5)]
    assert await asyncio.gather(*waiters) == [False] * 4  # every sync waiter gets its answer
    assert (w.stats.written, w.stats.dropped, w.stats.dropped_reasons) == (1, 4, {"disk": 4})
    assert w.stats.write_failures == 1 and w.stats.degraded and "No space left" in w.stats.last_error
    assert on_disk(tmp_path) == ["/r0"]
    assert all(line.error is None for seg in list_segments(tmp_path) for line in read_segment(seg))
    # The disk has room again: the same segment goes on, and health recovers.
    for i in range(5, 8):
        w.submit(rec(i))
    await until(lambda: w.stats.written == 4)
    assert await w.submit_and_wait(rec(8))
    assert not w.stats.degraded and on_disk(tmp_path) == ["/r0", "/r5", "/r6", "/r7", "/r8"]
    assert len(list_segments(tmp_path)) == 1 and w.stats.segments == 1


async def test_a_failed_fsync_drops_what_it_covered_and_takes_it_off_the_disk(writer, tmp_path):
    w = writer(window=10)  # only sync waiters trigger an fsync here
    assert await w.submit_and_wait(rec(0))
    w.fsync_faults = [OSError(errno.EIO, "Input/output error")]
    w.submit(rec(1))
    w.submit(rec(2))
    assert not await w.submit_and_wait(rec(3))
    assert (w.stats.written, w.stats.dropped, w.stats.dropped_reasons) == (1, 3, {"disk": 3})
    assert on_disk(tmp_path) == ["/r0"]  # on disk == written: no uncounted record survives
    assert await w.submit_and_wait(rec(4))
    assert w.stats.written == 2 and on_disk(tmp_path) == ["/r0", "/r4"] and not w.stats.degraded


async def test_failures_on_a_fresh_segment_leave_no_empty_files(writer, tmp_path):
    w = writer()
    w.write_faults = [(0, enospc()) for _ in range(10)]
    for i in range(10):
        assert not await w.submit_and_wait(rec(i))
    assert w.stats.dropped == 10 and w.stats.write_failures == 10
    assert len(list_segments(tmp_path)) <= 1  # one segment retried, never one per failure
    assert await w.submit_and_wait(rec(10))
    w.close()
    segs = list_segments(tmp_path)
    assert len(segs) == 1 and on_disk(tmp_path) == ["/r10"] and w.stats.written == 1


async def test_a_failure_on_the_first_write_leaves_no_segment_after_shutdown(writer, tmp_path):
    w = writer()
    w.write_faults = [(0, enospc())]
    assert not await w.submit_and_wait(rec(0))
    w.close()
    assert list_segments(tmp_path) == [] and w.stats.segments == 0


async def test_an_unexpected_error_in_the_writer_is_counted_and_the_writer_goes_on(writer, tmp_path):
    w = writer()
    w.write_faults = [(0, RuntimeError("a bug in the writer"))]
    assert not await asyncio.wait_for(w.submit_and_wait(rec(0)), 5)  # answered, not stranded
    assert w.stats.dropped_reasons == {"writer_error": 1} and w.stats.degraded
    assert "RuntimeError: a bug in the writer" in w.stats.last_error
    assert await w.submit_and_wait(rec(1))
    assert on_disk(tmp_path) == ["/r1"] and not w.stats.degraded


async def test_a_packer_that_fails_on_one_record_costs_only_that_record(writer, tmp_path):
    w = writer()
    packer = w._packer

    class Failing:
        def pack(self, batch, seg):
            if any(r.path == "/r1" for r, _, _ in batch):
                raise ValueError("cannot pack this body")
            return packer.pack(batch, seg)

    w._packer = Failing()
    results = await asyncio.gather(*(w.submit_and_wait(rec(i)) for i in range(3)))
    assert results == [True, False, True]
    assert w.stats.dropped_reasons == {"unencodable": 1} and on_disk(tmp_path) == ["/r0", "/r2"]
    assert "cannot pack this body" in w.stats.last_error


async def test_a_record_json_cannot_hold_is_counted_not_lost_silently(writer, tmp_path):
    w = writer()
    assert not w.submit(rec(0, extra={"huge": 1 << 70}))  # orjson refuses integers beyond 64 bits
    assert w.stats.dropped_reasons == {"unencodable": 1} and "64-bit" in w.stats.last_error
    assert await w.submit_and_wait(rec(1))
    assert on_disk(tmp_path) == ["/r1"]


async def test_a_stalled_disk_answers_sync_waiters_after_the_stall_timeout(writer, tmp_path):
    w = writer(stall_timeout=0.3)
    w.fsync_gate.clear()
    t0 = time.monotonic()
    assert not await w.submit_and_wait(rec(0))
    assert time.monotonic() - t0 < 2 and w.stats.degraded and "stalled" in w.stats.last_error
    w.fsync_gate.set()
    await until(lambda: w.stats.written == 1)  # it did land in the end, and was counted once
    assert w.stats.dropped == 0


class MovedClock:
    """The writer's monotonic clock, moved only by the test: how long a record has waited is then
    what the test says, however long a loaded machine takes between two lines."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch) -> MovedClock:
    moved = MovedClock()
    monkeypatch.setattr(writer_module, "time", moved)
    return moved


async def test_the_writer_falling_behind_raises_backpressure_until_it_catches_up(writer, clock, tmp_path):
    w = writer(window=0.1)
    w.write_gate.clear()
    w.submit(rec(0))
    await until(w.writing.is_set)  # the writer is now stuck in a write (a stalled disk)
    w.submit(rec(1))
    clock.now += w.lag_limit + 0.05
    assert not w.behind
    w.submit(rec(2))  # rec 1 has waited longer than half a window: the writer is behind
    assert w.behind
    waiting = asyncio.ensure_future(w.caught_up())
    await asyncio.sleep(0.1)
    assert not waiting.done()
    w.write_gate.set()
    assert await asyncio.wait_for(waiting, 5)
    assert not w.behind
    await until(lambda: w.stats.written == 3)


async def test_a_record_stuck_in_a_write_counts_for_the_backpressure(writer, clock, tmp_path):
    """A record the writer has taken from the queue but not yet written is as much at risk in a
    crash as a queued one: its wait raises the backpressure too."""
    w = writer(window=0.1)
    w.write_gate.clear()
    w.submit(rec(0))
    await until(w.writing.is_set)  # taken, and stuck in its write: the queue is empty
    clock.now += w.lag_limit + 0.05
    w.submit(rec(1))
    assert w.behind
    w.write_gate.set()
    clock.now += w.window  # the commit window passes: what was written is synced
    await until(lambda: w.stats.written == 2 and not w.behind)


def test_a_long_batch_reaches_the_kernel_a_slice_at_a_time(tmp_path):
    """Records taken together are masked and written in slices: the first is in its segment
    before the last is masked, not once the whole batch is."""
    events: list[tuple[str, str]] = []
    masker = Masker(parse_rules(("email",)), os.urandom(32))
    w = SegmentWriter(tmp_path, window=0.05, observe=lambda r, line, ok: events.append(("written", r.path)))
    w.transform = lambda r: (events.append(("masked", r.path)), masker.record(r))[1]
    text = " ".join(f"word{i} jane{i}@example.com" for i in range(2500))[: 48 * 1024]
    for i in range(60):  # queued before the writer starts: one batch, 2.9 MB of bodies
        r = rec(i)
        r.request_body = orjson.dumps({"messages": [{"role": "user", "content": text}]}).decode()
        w.submit(r)
    w.start()
    w.close()
    assert sorted(events) == sorted([(e, f"/r{i}") for i in range(60) for e in ("masked", "written")])
    first_written = events.index(("written", "/r0"))
    last_masked = events.index(("masked", "/r59"))
    assert first_written < last_masked, events[:5]
    assert [path for e, path in events if e == "written"] == [f"/r{i}" for i in range(60)]


def test_a_record_with_a_spilled_body_is_written_after_the_others_taken_with_it(tmp_path):
    """Copying a spilled body can take longer than the crash bound: records taken with it go first."""
    from toolproxy.record.spill import SpilledBody

    body = SpilledBody(str(tmp_path / "spill"))
    body.write(b"x" * (2 * 1024 * 1024))
    body.close().result()
    order: list[str] = []
    w = SegmentWriter(tmp_path, window=0.05, observe=lambda r, line, ok: order.append(r.path))
    big = rec(0)
    big.request_body = body
    for r in (rec(1), big, rec(2), rec(3)):
        w.submit(r)
    w.start()
    w.close()
    assert order == ["/r1", "/r2", "/r3", "/r0"]
    assert [r["path"] for r in read_records(tmp_path)] == ["/r1", "/r2", "/r3", "/r0"]
    assert read_records(tmp_path)[-1]["request_body"] == "x" * (2 * 1024 * 1024)


async def test_a_writer_that_never_catches_up_turns_health_degraded(writer, tmp_path):
    w = writer(window=0.1, stall_timeout=0.3)
    w.write_gate.clear()
    w.submit(rec(0))
    await until(w.writing.is_set)
    w.submit(rec(1))
    await asyncio.sleep(w.lag_limit + 0.05)
    w.submit(rec(2))
    assert w.behind and not await w.caught_up()  # gives up after stall_timeout: requests go on
    assert w.stats.degraded and "behind" in w.stats.last_error
    w.write_gate.set()
    await until(lambda: w.stats.written == 3 and not w.stats.degraded)


async def test_a_slow_fsync_does_not_hold_up_writing(writer, tmp_path):
    w = writer()
    w.fsync_gate.clear()
    first = asyncio.ensure_future(w.submit_and_wait(rec(0)))
    await until(lambda: on_disk(tmp_path) == ["/r0"])
    for i in range(1, 4):
        w.submit(rec(i))
    await until(lambda: len(on_disk(tmp_path)) == 4)  # in the kernel while the fsync still hangs
    assert not first.done() and w.stats.written == 0 and not w.behind
    w.fsync_gate.set()
    assert await first
    await until(lambda: w.stats.written == 4)


async def test_records_submitted_after_close_are_counted(writer, tmp_path):
    w = writer()
    assert await w.submit_and_wait(rec(0))
    w.close()
    assert not await w.submit_and_wait(rec(1))
    assert w.stats.dropped_reasons == {"stopped": 1} and w.stats.written == 1


@pytest.mark.parametrize(
    "field, value, stored, listed",
    [
        ("run", "caf\udce9", "caf\xe9", ["run"]),
        ("tags", {"note": "n\udce9e"}, {"note": "n\xe9e"}, ["tags.note"]),
        ("tags", {"k\udcff": "v"}, {"k\xff": "v"}, ["tags.{key}"]),
        ("condition_note", "lone \ud800 escape", "lone \xed\xa0\x80 escape", ["condition_note"]),
        ("request_headers", [["X-A", "\udcfe"]], [["X-A", "\xfe"]], ["request_headers[0][1]"]),
    ],
)
def test_text_that_is_not_utf8_is_stored_byte_for_byte(field, value, stored, listed):
    r = rec(0, **{field: value})
    line = encode_record(r)
    assert line.endswith(b"\n")
    back = orjson.loads(line)
    assert back[field] == stored and back["extra"]["latin1_fields"] == listed
    assert back["request_body"] == r.request_body and back["path"] == "/r0"


def test_ordinary_records_are_plain_orjson():
    r = rec(0, tags={"note": "café"})
    assert encode_record(r) == orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE)
