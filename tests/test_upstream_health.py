"""/_toolproxy/health reports the upstream's reachability apart from recording health.

The proxy runs as `toolproxy serve` subprocesses; the probe's timing rules are checked on the
UpstreamHealth object itself against a real emulated stack and a real socket that never answers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from toolproxy.emulators import FakeStack
from toolproxy.proxy.upstreamhealth import UpstreamHealth


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + "/_toolproxy/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _until(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_an_unreachable_upstream_is_reported_but_health_stays_200_while_recording_works(proxy):
    port = _closed_port()
    p = proxy(f"http://127.0.0.1:{port}", "--quiet", "--no-fingerprint")
    status, snap = _health(p.url)
    assert status == 200 and snap["status"] == "ok"
    up = _until(lambda: (h := _health(p.url)[1]["upstream_health"])["reachable"] is not None and h)
    assert up["reachable"] is False and up["source"] == "probe" and up["url"] == f"http://127.0.0.1:{port}"
    assert (
        f"nothing is listening at 127.0.0.1:{port} (connection refused)" in up["error"] and "Errno" not in up["error"]
    )
    assert abs(up["checked_at"] - time.time()) < 30 and up["age_s"] >= 0

    # A failed exchange is evidence too, newer than the probe's.
    req = urllib.request.Request(p.url + "/v1/chat/completions", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(req, timeout=10)
    assert failed.value.code == 502
    up = _health(p.url)[1]["upstream_health"]
    assert up["source"] == "exchange" and up["reachable"] is False
    assert up["error"].startswith(f"cannot connect to upstream http://127.0.0.1:{port}: nothing is listening")
    assert p.stats()["upstream_health"]["reachable"] is False  # stats carries it too


def test_a_reachable_upstream_is_known_from_the_start_fingerprint_and_probed_once_per_interval(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet")
    up = _until(lambda: (h := _health(p.url)[1]["upstream_health"])["reachable"] is not None and h)
    assert up["reachable"] is True and up["error"] is None and up["source"] == "fingerprint"
    probes_before = len(fake.probes)
    for _ in range(30):
        assert _health(p.url)[0] == 200
    assert len(fake.probes) == probes_before  # the fingerprint is fresh: no probe of its own
    assert fake.seen == []  # health never reaches the upstream as traffic


async def test_the_probe_is_rate_limited_and_refreshes_when_stale():
    fake = FakeStack("ollama")
    url = await fake.start()
    health = UpstreamHealth(url, connect_timeout=5.0, interval=0.3)
    try:
        first = await health.report()
        assert first["reachable"] is True and first["source"] == "probe" and not first["checking"]
        assert first["since"] == first["checked_at"]
        for _ in range(10):
            await health.report()
        assert [s.path for s in fake.probes] == ["/"]
        await asyncio.sleep(0.35)
        again = await health.report()
        assert [s.path for s in fake.probes] == ["/", "/"]
        # checked again, still reachable: since when stays the first time it was seen so
        assert again["checked_at"] > first["checked_at"] and again["since"] == first["since"]
        await fake.stop()
        # The upstream is gone now: the next stale report says so.
        await asyncio.sleep(0.35)
        gone = await health.report()
        assert gone["reachable"] is False and "connection refused" in gone["error"]
        assert gone["since"] == gone["checked_at"] > first["since"]
    finally:
        await health.stop()
        await fake.stop()


async def test_a_silent_upstream_never_holds_an_answer_longer_than_the_wait():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshake; nobody ever reads or answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        health = UpstreamHealth(url, connect_timeout=3.0, wait=0.3)
        try:
            t0 = time.monotonic()
            first = await health.report()
            second = await health.report()
            elapsed = time.monotonic() - t0
            assert elapsed < 1.5, elapsed
            assert first["checking"] and second["checking"] and first["reachable"] is None
            probe = health._probe
            await asyncio.wait([probe], timeout=5)
            done = await health.report()
            assert health._probe is probe  # one probe for all three reports
            assert done["reachable"] is False and "did not answer in time" in done["error"] and not done["checking"]
        finally:
            await health.stop()
    finally:
        silent.close()
