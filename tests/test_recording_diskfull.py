"""A real full disk: a 2 MB tmpfs mounted for this module (needs root; skipped with the reason
elsewhere), a real `toolproxy serve` recording onto it, and a filler file taking the space."""

from __future__ import annotations

import base64
import errno
import json
import os
import subprocess
import time
import uuid

import pytest
from rawhttp import raw_request

from toolproxy.record.segments import list_segments, read_segment

JSON = [(b"Content-Type", b"application/json")]


@pytest.fixture(scope="module")
def small_fs(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("mounting a 2 MB tmpfs for the full-disk test needs root")
    where = tmp_path_factory.mktemp("smallfs")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    yield where
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def fs_dir(small_fs):
    """A fresh directory on the small filesystem, emptied afterwards so the next test has room."""
    d = small_fs / uuid.uuid4().hex[:8]
    d.mkdir()
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=True)


def fill(path, leave: int = 0) -> None:
    """Take the filesystem's free space, leaving about `leave` bytes."""
    st = os.statvfs(path.parent)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    with open(path, "wb", buffering=0) as f:
        try:
            f.write(b"\0" * size)
            while leave == 0:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def request_body(i: int, size: int = 22 * 1024) -> bytes:
    # Random text: neither repeated content (stored once) nor compression shrinks it.
    content = f"request {i:03d} " + base64.b64encode(os.urandom(size * 3 // 4)).decode()
    return json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]}).encode()


def on_disk(data) -> tuple[list[int], list]:
    """(request numbers of the complete records on disk, segment files holding no record)."""
    numbers, empty = [], []
    for seg in list_segments(data):
        lines = list(read_segment(seg))
        assert all(line.error is None for line in lines), f"a partial or corrupt line in {seg}"
        recs = [json.loads(line.record["request_body"])["messages"][0]["content"].split()[1] for line in lines]
        numbers += [int(n) for n in recs]
        if not recs:
            empty.append(seg.name)
    return numbers, empty


def health_within(p, status: int, timeout: float) -> bool:
    """Whether the health route answers `status` within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while p.health()[0] != status:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def settled(p, total: int, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        rec = p.stats()["recording"]
        if rec["written"] + rec["dropped"] >= total or time.monotonic() > deadline:
            return rec
        time.sleep(0.05)


@pytest.mark.parametrize("durability", ["group", "sync"])
async def test_a_full_disk_counts_every_lost_record_and_recovers_without_litter(fake_stack, proxy, fs_dir, durability):
    fake = fake_stack("openai")
    data = fs_dir / "data"
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--durability", durability, data=data)
    filler = fs_dir / "filler"
    fill(filler, leave=500 * 1024)  # room for about 20 of the 40 records
    for i in range(40):
        status, _ = await raw_request(p.url, b"/v1/chat/completions", JSON, request_body(i))
        assert status == 200  # --on-record-failure serve: traffic goes on
    rec = settled(p, 40)
    numbers, empty = on_disk(data)
    assert rec["written"] + rec["dropped"] == 40 and rec["dropped_reasons"] == {"disk": rec["dropped"]}
    assert len(numbers) == rec["written"] and len(set(numbers)) == len(numbers), (len(numbers), rec)
    assert rec["dropped"] > 0, "the disk never filled: the test did not test anything"
    assert empty == [] and rec["write_failures"] >= 1
    status, health = p.health()
    assert status == 503 and health["status"] == "degraded" and "No space left" in health["recording"]["last_error"]

    filler.unlink()  # the operator frees space: recording resumes in the same segment
    for i in range(40, 45):
        status, _ = await raw_request(p.url, b"/v1/chat/completions", JSON, request_body(i))
        assert status == 200
    rec = settled(p, 45)
    numbers, empty = on_disk(data)
    assert rec["written"] + rec["dropped"] == 45 and len(numbers) == rec["written"]
    assert numbers[-5:] == [40, 41, 42, 43, 44] and empty == []
    assert p.health()[0] == 200
    p.stop()
    numbers, empty = on_disk(data)
    assert len(numbers) == rec["written"] and empty == []


async def test_block_mode_refuses_as_soon_as_the_disk_fails_and_stops_promptly_after(fake_stack, proxy, fs_dir):
    fake = fake_stack("openai")
    data = fs_dir / "data"
    # A long commit window: refusing must not wait for the next fsync to notice the failure.
    p = proxy(
        fake.url, "--quiet", "--no-fingerprint", "--on-record-failure", "block", "--commit-window", "5", data=data
    )
    assert (await raw_request(p.url, b"/v1/chat/completions", JSON, request_body(0, 100)))[0] == 200
    assert len(p.wait_records(1)) == 1  # in the segment before the disk fills
    filler = fs_dir / "filler"
    fill(filler)
    # The exchange whose record hits the full disk cannot know in time (its response is already
    # out); the failure shows at that write, not at the next fsync (5 s away), and from then on
    # every request is refused.
    assert (await raw_request(p.url, b"/v1/chat/completions", JSON, request_body(1)))[0] == 200
    assert health_within(p, 503, 2.0)
    status, answer = await raw_request(p.url, b"/v1/chat/completions", JSON, request_body(2))
    assert status == 503 and b"recording_unavailable" in answer and b"No space left" in answer
    assert len(fake.seen) == 2  # refused before anything went upstream
    assert settled(p, 3)["dropped"] >= 1 and p.health()[0] == 503  # a 503 record fitting a last page is no recovery

    filler.unlink()
    # The first refused exchange after the space is back is recorded, and that clears the failure.
    assert (await raw_request(p.url, b"/v1/chat/completions", JSON, request_body(3, 100)))[0] == 503
    assert health_within(p, 200, 2.0)
    assert (await raw_request(p.url, b"/v1/chat/completions", JSON, request_body(4, 100)))[0] == 200
    rec = settled(p, 5)
    assert rec["written"] + rec["dropped"] == 5 and rec["dropped"] >= 1
