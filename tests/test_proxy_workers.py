"""`serve --workers N`: real worker processes sharing one port, supervised, with merged stats."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

from toolproxy.proxy.groupstats import STALE_AFTER, group_snapshot, merge_snapshots
from toolproxy.record.segments import list_segments

MSGS = [{"role": "user", "content": "hi"}]


async def fire(url: str, n: int, stream_every: int = 3) -> list[int]:
    """n requests, each on its own connection so the kernel spreads them across workers."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=32)) as s:

        async def one(i: int) -> int:
            body = {"model": "gpt-4o-mini", "messages": MSGS, "stream": i % stream_every == 0}
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
                return r.status

        return await asyncio.gather(*(one(i) for i in range(n)))


def wait_for(predicate, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited; only its parent's wait is missing
        return f.read().split(") ", 1)[1].startswith("Z")


async def test_workers_share_the_port_merge_stats_survive_a_crash_and_stop_together(fake_stack, proxy, tmp_path):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--workers", "2", "--quiet", "--no-fingerprint")
    statuses = await fire(p.url, 240)
    assert statuses == [200] * 240

    # Any worker's stats answer for the group: counts equal what the clients saw.
    stats = wait_for(
        lambda: (s := p.stats())["exchanges"] == 240 and s["recording"]["written"] == 240 and s,
        "merged stats to reach 240 exchanges",
    )
    assert stats["status"] == "ok" and stats["by_status_class"] == {"2xx": 240}
    group = stats["workers"]
    assert group["count"] == 2 and group["answering"] == 2 and group["restarts"] == 0
    per = group["per_worker"]
    assert sorted(w["index"] for w in per) == [0, 1]
    assert all(w["exchanges"] > 0 for w in per), per  # the kernel gave both workers connections
    assert sum(w["exchanges"] for w in per) == 240

    # One writer per worker: segments named by process, never shared, and analyze reads them all.
    recs = p.wait_records(240)
    assert len(recs) == 240 and len({r["id"] for r in recs}) == 240
    pids = {w["pid"] for w in per}
    writers = {seg.name.split("-")[1] for seg in list_segments(p.data)}
    assert writers == {str(pid) for pid in pids}
    r = subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", "analyze", "--data", str(p.data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "sql",
            "--data",
            str(p.data),
            "--format",
            "json",
            "select count(*) as n, count(distinct id) as ids from exchanges",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(r.stdout) == [{"n": 240, "ids": 240}]

    # A worker that dies is reported and replaced; the group's counters do not go backwards, and
    # say they may miss what the killed worker did after its last report.
    victim, victim_index = per[0]["pid"], per[0]["index"]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: "exited with signal SIGKILL; restarting it" in p.output(), "the crash to be reported")
    stats = wait_for(
        lambda: (
            (s := p.stats())["workers"]["restarts"] == 1
            and s["workers"]["answering"] == 2
            and s["status"] != "degraded"
            and s
        ),
        "the worker to be restarted",
    )
    assert stats["status"] == "partial" and p.health()[0] == 200  # serving and recording: not a failure
    [missing] = stats["workers"]["counts_missing"]
    assert f"worker {victim_index} (pid {victim}) exited with signal SIGKILL" in missing and "partial" in missing
    assert {w["index"]: w["restarts"] for w in stats["workers"]["per_worker"]} == {victim_index: 1, 1 - victim_index: 0}
    new_pids = {w["pid"] for w in stats["workers"]["per_worker"]}
    assert victim not in new_pids and len(new_pids) == 2
    assert stats["exchanges"] == 240 and stats["recording"]["written"] == 240
    assert f"pid {victim}" in stats["workers"]["last_exit"]
    assert await fire(p.url, 40) == [200] * 40
    wait_for(lambda: p.stats()["exchanges"] == 280, "stats to count the requests after the restart")

    # SIGTERM to the supervisor stops every worker, each flushing its records first.
    assert p.stop() == 0
    assert all(gone(pid) for pid in new_pids)
    assert len(p.records()) == 280
    assert "Traceback" not in p.output()


def test_ctrl_c_stops_the_whole_group(fake_stack, tmp_path):
    """A terminal's Ctrl-C signals the whole foreground process group: supervisor and workers."""
    fake = fake_stack("openai")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            fake.url,
            "--port",
            "0",
            "--data",
            str(tmp_path / "d"),
            "--workers",
            "2",
            "--quiet",
            "--no-fingerprint",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line and "2 workers" in line
        children = wait_for(lambda: _children(proc.pid) if len(_children(proc.pid)) == 2 else None, "two workers")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert all(gone(pid) for pid in children)
    err = proc.stderr.read()
    assert "shutting down" in err and "Traceback" not in err and "restarting" not in err


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_a_port_in_use_is_a_clear_error_not_a_restart_loop(fake_stack, tmp_path):
    fake = fake_stack("openai")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "from toolproxy.cli import main; main()",
                "serve",
                "--upstream",
                fake.url,
                "--port",
                str(port),
                "--data",
                str(tmp_path / "d"),
                "--workers",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Address already in use" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "live, retired, expected",
    [
        # counters add up; gauges and status come from the live workers only
        (
            [{"exchanges": 3, "in_flight": 1, "status": "ok"}, {"exchanges": 4, "in_flight": 2, "status": "ok"}],
            [{"exchanges": 10, "in_flight": 5, "status": "degraded"}],
            {"exchanges": 17, "in_flight": 3, "status": "ok"},
        ),
        # one degraded worker makes the group degraded, with its reason
        (
            [
                {"status": "ok", "recording": {"last_error": None, "written": 1}},
                {"status": "degraded", "recording": {"last_error": "disk full", "written": 2}},
            ],
            [],
            {"status": "degraded", "recording": {"last_error": "disk full", "written": 3}},
        ),
        # nested counters keyed by kind merge by key; uptime is the longest, not the sum
        (
            [{"errors": {"timeout": 1}, "uptime_s": 5.0}, {"errors": {"timeout": 2, "connect": 1}, "uptime_s": 7.0}],
            [],
            {"errors": {"timeout": 3, "connect": 1}, "uptime_s": 7.0},
        ),
        # settings and names: the first worker's value; lists are united
        (
            [
                {"upstream": "http://a", "stack": {"models": ["m1"]}},
                {"upstream": "http://a", "stack": {"models": ["m2", "m1"]}},
            ],
            [],
            {"upstream": "http://a", "stack": {"models": ["m1", "m2"]}},
        ),
        # a worker that has not fingerprinted yet (None) does not hide the other's answer
        ([{"stack": None}, {"stack": {"stack": "vllm"}}], [], {"stack": {"stack": "vllm"}}),
    ],
)
def test_merge_snapshots(live, retired, expected):
    assert merge_snapshots(live, retired) == expected


def test_a_silent_worker_degrades_the_group():
    now = 1000.0
    own = {"status": "ok", "exchanges": 1, "worker": {"index": 0, "pid": 10, "published_at": now}}
    peer_fresh = {"status": "ok", "exchanges": 2, "worker": {"index": 1, "pid": 11, "published_at": now - 0.1}}
    peer_stale = {
        "status": "ok",
        "exchanges": 4,
        "worker": {"index": 2, "pid": 12, "published_at": now - STALE_AFTER - 1},
    }
    supervisor = {"count": 4, "pids": [10, 11, 12, 13], "restarts": 0}
    snap = group_snapshot(own, [peer_fresh, peer_stale], [], supervisor, now=now)
    assert snap["exchanges"] == 7 and snap["status"] == "degraded"
    assert snap["workers"]["answering"] == 2
    problems = " | ".join(snap["workers"]["problems"])
    assert "worker 2 (pid 12) last reported" in problems and "pid 13 has not reported yet" in problems
    healthy = group_snapshot(own, [peer_fresh], [], {"count": 2, "pids": [10, 11]}, now=now)
    assert healthy["status"] == "ok" and "problems" not in healthy["workers"]
    restarting = group_snapshot(
        own,
        [peer_fresh],
        [],
        {"count": 3, "pids": [10, 11], "last_exit": "worker 2 (pid 9) exited with signal SIGKILL"},
        now=now,
    )
    assert restarting["status"] == "degraded"
    assert restarting["workers"]["problems"] == [
        "1 of 3 workers not running (being restarted after: worker 2 (pid 9) exited with signal SIGKILL)"
    ]


def test_a_killed_workers_counts_are_said_to_be_partial_and_a_stopped_ones_are_not():
    now = 1000.0
    own = {"status": "ok", "exchanges": 1, "worker": {"index": 0, "pid": 10, "published_at": now}}
    peer = {"status": "ok", "exchanges": 2, "worker": {"index": 1, "pid": 12, "published_at": now}}
    killed = {
        "status": "ok",
        "exchanges": 4,
        "worker": {"index": 1, "pid": 11, "published_at": now - 5.25, "exit": "signal SIGKILL", "exited_at": now - 5.0},
    }
    stopped = {
        "status": "ok",
        "exchanges": 8,
        "worker": {
            "index": 1,
            "pid": 9,
            "published_at": now - 60,
            "final": True,
            "exit": "code 0",
            "exited_at": now - 60,
        },
    }
    supervisor = {
        "count": 2,
        "pids": [10, 12],
        "restarts": 2,
        "slots": [{"index": 0, "pid": 10, "restarts": 0}, {"index": 1, "pid": 12, "restarts": 2}],
    }
    snap = group_snapshot(own, [peer], [killed, stopped], supervisor, now=now)
    assert snap["exchanges"] == 15 and snap["status"] == "partial"
    assert snap["workers"]["counts_missing"] == [
        "worker 1 (pid 11) exited with signal SIGKILL, 0.25s after its last report: what it did after that report "
        "(exchanges, records written) is in no count, so these totals are partial"
    ]
    assert [w["restarts"] for w in snap["workers"]["per_worker"]] == [0, 2]
    complete = group_snapshot(own, [peer], [stopped], supervisor, now=now)
    assert complete["status"] == "ok" and "counts_missing" not in complete["workers"]
    # A degraded group says so first; the partial counts are still named.
    down = group_snapshot(own, [peer], [killed], {**supervisor, "count": 3}, now=now)
    assert down["status"] == "degraded" and down["workers"]["counts_missing"]
    restarting = group_snapshot(
        own,
        [],
        [killed],
        {
            **supervisor,
            "pids": [10],
            "slots": [{"index": 0, "pid": 10, "restarts": 0}, {"index": 1, "pid": None, "restarts": 2}],
        },
        now=now,
    )
    assert restarting["workers"]["not_running"] == [1]


def test_a_writer_never_appends_to_a_segment_it_did_not_create(tmp_path):
    """Segment names carry the pid; a restarted worker that got a dead one's pid must not append."""
    import os

    from toolproxy.record.model import Record, new_id
    from toolproxy.record.segments import read_records
    from toolproxy.record.writer import SEGMENT_DIR, SegmentWriter

    seg_dir = tmp_path / SEGMENT_DIR
    seg_dir.mkdir()
    now = time.time()
    stamps = {
        time.strftime("%Y%m%dT%H%M%S", time.gmtime(now + d)) for d in (0, 1, 2)
    }  # the writer may start a second later
    squatters = [seg_dir / f"{stamp}-{os.getpid()}-{n:04d}.jsonl" for stamp in stamps for n in (1, 2)]
    for path in squatters:
        path.write_bytes(b'{"torn": ')  # a dead writer's torn tail
    writer = SegmentWriter(tmp_path)
    writer.start()
    writer.submit(
        Record(id=new_id(), started_at=time.time(), upstream="http://127.0.0.1:1", method="GET", path="/v1/models")
    )
    writer.close()
    assert all(p.read_bytes() == b'{"torn": ' for p in squatters)
    assert [r["path"] for r in read_records(tmp_path, "exchange")] == ["/v1/models"]


def test_serve_lifts_a_low_open_files_limit_for_every_worker(fake_stack, tmp_path):
    """Two sockets per stream: a soft limit of 1024 would stop a proxy at ~500 streams."""
    import resource

    fake = fake_stack("openai")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit here ({hard}) leaves nothing to lift")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            fake.url,
            "--port",
            "0",
            "--data",
            str(tmp_path / "d"),
            "--workers",
            "2",
            "--quiet",
            "--no-fingerprint",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
    )
    try:
        assert "listening on" in proc.stdout.readline()
        for pid in [proc.pid, *_children(proc.pid)]:
            limits = open(f"/proc/{pid}/limits").read()
            soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max open files"))
            assert soft == ("unlimited" if hard == resource.RLIM_INFINITY else str(hard)), (pid, soft)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
