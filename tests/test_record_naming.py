"""What lets replicas on several hosts share one data directory: segment names that carry the
replica, ids unique and sortable without coordination, and the test-only clock offset."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import duckdb
import pytest

from toolproxy.record.model import CLOCK_OFFSET_ENV, Record, new_id
from toolproxy.record.segments import REFUSALS_STREAM, SEGMENT_REPLICA, list_segments, read_records
from toolproxy.record.writer import REPLICA_ENV, SegmentWriter, replica_name


@pytest.mark.parametrize(
    "value, expected",
    [
        ("replica-a", "replica-a"),
        ("toolproxy-7d9f6c-x2kq", "toolproxy-7d9f6c-x2kq"),
        ("host.example.com", "host.example.com"),
        ("a/b\\c d", "a_b_c_d"),  # never a path, never a space
        ("../../etc", "etc"),  # no leading dots: never a hidden or relative name
        ("\x1b[31mred\x07", "31mred"),  # control characters go
        ("é🙂名", "host"),  # nothing left: a fixed name, not an empty one
        ("x" * 200, "x" * 64),
    ],
)
def test_replica_name_is_safe_in_a_file_name_and_an_object_key(monkeypatch, value, expected):
    monkeypatch.setenv(REPLICA_ENV, value)
    assert replica_name() == expected


def test_replica_name_defaults_to_the_host_name(monkeypatch):
    monkeypatch.delenv(REPLICA_ENV, raising=False)
    assert replica_name() == re.sub(r"[^A-Za-z0-9_.-]+", "_", socket.gethostname()).strip("._-")[:64]


def test_two_writers_named_apart_share_a_directory_and_their_names_say_who_wrote(monkeypatch, tmp_path):
    writers = []
    for name in ("host-a", "host-b"):
        monkeypatch.setenv(REPLICA_ENV, name)
        w = SegmentWriter(tmp_path, window=0.01)
        w.start()
        writers.append(w)
    for i, w in enumerate(writers * 3):
        w.submit(Record(id=new_id(), started_at=time.time(), path=f"/{i}"))
    for w in writers:
        w.close()
    segments = list_segments(tmp_path)
    assert sorted(re.match(SEGMENT_REPLICA, p.name).group(1) for p in segments) == ["host-a", "host-b"]
    assert sorted(r["path"] for r in read_records(tmp_path)) == [f"/{i}" for i in range(6)]
    assert re.match(SEGMENT_REPLICA, "20261129T120000-1-0001.jsonl") is None  # names from before replicas


def test_a_refusals_stream_is_named_apart_yet_names_the_same_replica(monkeypatch, tmp_path):
    """Refused requests' segments are told apart by their name, and are the same host's (one clock)
    to the analyzer, which counts replicas by name."""
    monkeypatch.setenv(REPLICA_ENV, "host-a.b")
    writers = [SegmentWriter(tmp_path, window=0.01), SegmentWriter(tmp_path, window=0.01, stream=REFUSALS_STREAM)]
    for i, w in enumerate(writers):
        w.start()
        w.submit(Record(id=new_id(), started_at=time.time(), path=f"/{i}"))
        w.close()
    names = sorted(p.name for p in list_segments(tmp_path))
    assert [name.endswith(".refused.jsonl") for name in names] == [False, True]
    assert [re.match(SEGMENT_REPLICA, name).group(1) for name in names] == ["host-a.b", "host-a.b"]
    assert duckdb.sql(
        f"select distinct regexp_extract(n, '{SEGMENT_REPLICA}', 1) from (select unnest({names}) as n)"
    ).fetchall() == [("host-a.b",)]


def test_ids_are_sortable_unique_and_follow_the_clock():
    ids = [new_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids[:100])
    ms = int(ids[-1][:12], 16)
    assert abs(ms - time.time() * 1000) < 5_000


def stamps(offset: str | None) -> tuple[float, float, float]:
    """(wall clock, the recorder's clock, an id's milliseconds / 1000) in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != CLOCK_OFFSET_ENV}
    if offset is not None:
        env[CLOCK_OFFSET_ENV] = offset
    code = (
        "import time; from toolproxy.record.model import new_id, now; "
        "print(time.time(), now(), int(new_id()[:12], 16) / 1000)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    wall, clock, id_s = map(float, out.stdout.split())
    return wall, clock, id_s


@pytest.mark.parametrize("offset, shift", [(None, 0.0), ("-240", -240.0), ("3600.5", 3600.5), ("nonsense", 0.0)])
def test_the_test_clock_offset_shifts_times_and_ids_alike(offset, shift):
    wall, clock, id_s = stamps(offset)
    assert abs(clock - wall - shift) < 1.0 and abs(id_s - wall - shift) < 1.0
