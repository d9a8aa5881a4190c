"""Resource bounds and honest timings on the hot path: sync durability holds only a response's
end, the upstream pool has no hidden queue, slow clients are cut off, probing is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

from toolproxy.checks.local import local_proxy
from toolproxy.emulators import stall, text
from toolproxy.proxy import stackwatch
from toolproxy.proxy.durability import LastBytes, expected_body_length
from toolproxy.proxy.forward import _CLOSE_RACE_S
from toolproxy.proxy.pool import KEEPALIVE_S, PoolStats, upstream_session
from toolproxy.stacks.fingerprint import GET_PROBES

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "method, status, headers, expected",
    [
        ("POST", 200, [("Content-Length", "12")], 12),
        ("POST", 200, [("content-length", " 0 ")], 0),
        ("POST", 200, [("Content-Type", "text/event-stream")], None),  # chunked, or until close
        ("POST", 200, [("Content-Length", "12, 12")], None),  # not a length the proxy will trust
        ("POST", 200, [("Content-Length", "-1")], None),
        ("HEAD", 200, [("Content-Length", "12")], 0),
        ("GET", 204, [], 0),
        ("GET", 304, [("Content-Length", "12")], 0),
        ("GET", 101, [], 0),
    ],
)
def test_expected_body_length(method, status, headers, expected):
    assert expected_body_length(method, status, headers) == expected


@pytest.mark.parametrize(
    "expected, chunks, sent, held",
    [
        (None, [b"ab", b"cd"], [b"ab", b"cd"], b""),  # unknown length: the end is the terminator, not bytes
        (4, [b"ab", b"cd"], [b"ab", b""], b"cd"),
        (4, [b"abcd"], [b""], b"abcd"),
        (5, [b"a", b"b", b"cde"], [b"a", b"b", b""], b"cde"),
        (2, [b"abc", b"d"], [b"", b""], b"abcd"),  # more than announced: nothing of it slips out early
    ],
)
def test_last_bytes_holds_only_the_chunk_that_completes_the_length(expected, chunks, sent, held):
    hold = LastBytes(expected)
    assert [hold.take(c) for c in chunks] == sent
    assert hold.held == held
    assert hold.headers_only is (expected == 0)


async def _first_event_after(url: str) -> tuple[float, bytes]:
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        async with s.post(url, json={"model": "gpt-4o-mini", "messages": MSGS, "stream": True}) as r:
            assert r.status == 200
            first = await r.content.readuntil(b"\n\n")
            return time.monotonic() - t0, first


async def test_sync_durability_forwards_a_stalled_streams_first_event_at_once(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.replies.append(text("one two three"))
    fake.inject(stall(between=3.0))
    p = proxy(fake.url, "--quiet", "--durability", "sync", "--no-fingerprint")
    took, first = await _first_event_after(p.url + "/v1/chat/completions")
    assert first.startswith(b"data: {") and took < 1.5, (took, first)


async def test_sync_durability_still_ends_a_stream_only_after_its_record(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.inject(stall(between=0.05))
    p = proxy(fake.url, "--quiet", "--durability", "sync", "--commit-window", "5", "--no-fingerprint")
    async with aiohttp.ClientSession() as s:
        async with s.post(
            p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": MSGS, "stream": True}
        ) as r:
            body = await r.read()
    assert body.endswith(b"data: [DONE]\n\n")
    recs = p.records()  # no waiting: the terminating chunk came after the fsync
    assert len(recs) == 1 and recs[0]["response_complete"] and recs[0]["response_body"].encode() == body


async def test_sync_durability_covers_refusals_by_any_addon(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(
        fake.url, "--quiet", "--durability", "sync", "--commit-window", "5", "--auth-token", "t0k", "--no-fingerprint"
    )
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": MSGS}) as r:
            assert r.status == 401
    assert [r["error_kind"] for r in p.records()] == ["unauthorized"]  # on disk before the answer left
    assert fake.seen == []


async def _stream_all(url: str, n: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one(i):
            async with s.post(url, json={"model": "gpt-4o-mini", "messages": MSGS, "stream": True}) as r:
                assert r.status == 200
                await r.read()

        await asyncio.gather(*(one(i) for i in range(n)))


async def test_a_capped_upstream_pool_records_the_wait_apart_from_ttfb(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.responder = lambda req: text("one two three four")
    fake.inject(stall(between=0.3, times=None))  # each stream holds its connection ~2 s
    p = proxy(fake.url, "--quiet", "--upstream-connections", "2", "--no-fingerprint")
    await _stream_all(p.url + "/v1/chat/completions", 6)
    recs = p.wait_records(6)
    waits = sorted(r["pool_wait_ms"] or 0.0 for r in recs)
    assert waits[:2] == [0.0, 0.0] and all(w > 500 for w in waits[2:]), waits
    # The upstream answers at once: the queue is not blamed on it.
    assert all(r["ttfb_ms"] < 500 for r in recs), [r["ttfb_ms"] for r in recs]
    pool = p.health()[1]["upstream_pool"]
    assert pool["limit"] == 2 and pool["requests_waited"] == 4 and pool["waiting_now"] == 0
    assert pool["wait_ms_max"] == pytest.approx(max(waits), abs=1.0)


async def test_a_request_that_times_out_in_the_pool_queue_says_so(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.responder = lambda req: text("one two three four")
    fake.inject(stall(between=1.0, times=1))  # the first stream holds the only connection for seconds
    p = proxy(fake.url, "--quiet", "--upstream-connections", "1", "--ttfb-timeout", "1", "--no-fingerprint")
    async with aiohttp.ClientSession() as s:
        first = await s.post(
            p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": MSGS, "stream": True}
        )
        async with s.post(p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": MSGS}) as r:
            assert r.status == 504
            message = (await r.json())["error"]["message"]
        assert "no connection to upstream" in message and "--upstream-connections" in message
        await first.read()
        first.release()
    recs = p.wait_records(2)
    queued = [r for r in recs if r["error_kind"] == "timeout"]
    assert len(queued) == 1 and queued[0]["pool_wait_ms"] > 900 and queued[0]["ttfb_ms"] is None
    pool = p.health()[1]["upstream_pool"]
    assert pool["waiting_now"] == 0 and pool["requests_waited"] == 1  # the cancelled wait was settled


async def _answer_probe(head: bytes, writer: asyncio.StreamWriter) -> bool:
    """The proxy's health probe of the root: llama.cpp serves its web page there."""
    if not head.startswith(b"GET "):
        return False
    page = b"<!doctype html><title>llama.cpp</title>"
    writer.write(
        b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s"
        % (len(page), page)
    )
    await writer.drain()
    writer.close()
    return True


async def _read_request(reader: asyncio.StreamReader, head: bytes) -> bytes:
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    return await reader.readexactly(length)


@contextlib.asynccontextmanager
async def llamacpp_closing_after_streams(close_after: float = 0.0, read: list | None = None):
    """Behaves as llama.cpp's server does on the wire after a streamed reply (checked against
    llama-server 0c1e570): it announces `Keep-Alive: timeout=5, max=100`, sends the terminating
    chunk, and then closes the connection anyway, reading nothing more. `close_after` is how long
    its thread takes to get there (a loaded server); each request it reads goes into `read`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if await _answer_probe(head, writer):
            return
        body = await _read_request(reader, head)
        if read is not None:
            read.append(body)
        writer.write(
            b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\nX-Accel-Buffering: no\r\n"
            b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"
        )
        for event in (b'data: {"choices":[{"delta":{"content":"hi"},"index":0}]}\n\n', b"data: [DONE]\n\n"):
            await asyncio.sleep(0.2)
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(close_after)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("close_after", [0.0, _CLOSE_RACE_S / 4])
async def test_a_capped_pool_in_front_of_llamacpp_answers_every_queued_request(proxy, close_after):
    """The connection llama.cpp is about to close can reach a queued request first: sent again, never a 502.
    With the close late (well within the resend window), every queued request meets it; the server
    reads each request once."""
    read: list[bytes] = []
    async with llamacpp_closing_after_streams(close_after, read) as upstream:
        p = proxy(upstream, "--quiet", "--upstream-connections", "1", "--no-fingerprint")
        await _stream_all(p.url + "/v1/chat/completions", 4)
        recs = p.wait_records(4)
    assert [r["client_status"] for r in recs] == [200] * 4 and all(r["response_complete"] for r in recs)
    assert len(read) == 4
    resent = [r["extra"]["resent"] for r in recs if "resent" in r["extra"]]
    if close_after:
        assert resent and all(
            reason.startswith("the upstream closed a kept-alive connection before answering") for reason in resent
        ), resent
    assert p.stats()["resent"] == len(resent)  # counted, not only visible record by record


async def test_a_request_the_upstream_may_have_read_is_not_sent_again(proxy):
    """An upstream that reads a request and closes without a byte may have acted on it: a 502, never a
    second copy, when the connection was fresh, or when the close came long after the request."""
    read: list[bytes] = []
    on: list[object] = []  # the connection each request in `read` came on

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if await _answer_probe(head, writer):
            return
        read.append(await _read_request(reader, head))
        on.append(writer)
        if b"keep" in read[-1]:  # answer, keep the connection for the next request
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            read.append(await _read_request(reader, head))
            on.append(writer)
            await asyncio.sleep(_CLOSE_RACE_S + 0.5)  # works on it longer than a close racing a handover takes
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        p = proxy(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "--quiet", "--no-fingerprint")
        async with aiohttp.ClientSession() as s:
            statuses = []
            for content in ("fresh", "keep", "slow"):
                async with s.post(
                    p.url + "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": content}]},
                ) as r:
                    statuses.append(r.status)
        recs = sorted(p.wait_records(3), key=lambda r: r["started_at"])
    assert statuses == [502, 200, 502]
    # each read once, in order; "slow" went on the connection "keep" left open (a reused one)
    assert [next(c for c in ("fresh", "keep", "slow") if c.encode() in b) for b in read] == ["fresh", "keep", "slow"]
    assert on[0] is not on[1] and on[1] is on[2]
    for rec in (recs[0], recs[2]):
        assert rec["error_kind"] == "upstream_closed" and "resent" not in rec["extra"]
    assert p.stats()["resent"] == 0


async def test_the_upstream_pool_lets_go_of_idle_connections_before_common_servers_close_them():
    """cpp-httplib, uvicorn and Node close a connection idle for 5 s; the behaviour itself is the
    slow test below (it waits the seconds out)."""
    session = upstream_session(PoolStats(0), 5.0)
    try:
        assert session.connector._keepalive_timeout == KEEPALIVE_S < 5
    finally:
        await session.close()


@pytest.mark.slow
async def test_the_pool_lets_go_of_idle_connections_before_llamacpp_does(proxy):
    """cpp-httplib (llama.cpp's server) closes a connection idle for 5 s: the pool lets go first, so
    a request never meets that close. Here the upstream counts connections and closes none."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if await _answer_probe(head, writer):
                    return
                await _read_request(reader, head)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\nKeep-Alive: timeout=5, max=100\r\n\r\n{}"
                )
                await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        p = proxy(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "--quiet", "--no-fingerprint")
        async with aiohttp.ClientSession() as s:
            for pause in (0.0, 0.5, 4.5):  # reused after half a second; not after 4.5 s, close to the 5
                await asyncio.sleep(pause)
                async with s.post(p.url + "/v1/chat/completions", json={"model": "m", "messages": MSGS}) as r:
                    assert r.status == 200
        assert len(p.wait_records(3)) == 3
    assert connections == 3  # the probe's, the first request's, and a new one after 4.5 s idle


async def test_the_default_upstream_pool_follows_the_clients(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.responder = lambda req: text("one two three four")
    fake.inject(stall(between=0.3, times=None))
    p = proxy(fake.url, "--quiet", "--no-fingerprint")
    t0 = time.monotonic()
    await _stream_all(p.url + "/v1/chat/completions", 40)
    took = time.monotonic() - t0
    recs = p.wait_records(40)
    assert all(r["pool_wait_ms"] is None for r in recs)
    assert p.health()[1]["upstream_pool"]["limit"] is None
    assert took < 2 * min(r["duration_ms"] for r in recs) / 1000.0  # all 40 ran side by side


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


async def test_slow_request_heads_are_cut_off(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--client-header-timeout", "1", "--no-fingerprint")
    socks = [_connect(p.url) for _ in range(40)]
    t0 = time.monotonic()
    for s in socks:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    for _ in range(3):  # trickle one header line per socket every half second
        await asyncio.sleep(0.5)
        for s in socks:
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                pass
    closed = 0
    for s in socks:
        s.settimeout(max(0.1, 4.0 - (time.monotonic() - t0)))
        try:
            data = s.recv(4096)
            closed += data == b"" or data.startswith(b"HTTP/1.1 4")
        except ConnectionResetError:
            closed += 1
        except TimeoutError:
            pass
        s.close()
    assert closed == 40 and time.monotonic() - t0 < 5
    assert fake.seen == []


async def test_a_stalled_request_body_is_a_408_and_recorded(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--client-body-timeout", "1", "--no-fingerprint")
    s = _connect(p.url)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": '
    )
    t0 = time.monotonic()
    s.settimeout(5)
    head = s.recv(4096)
    took = time.monotonic() - t0
    s.close()
    assert head.startswith(b"HTTP/1.1 408") and took < 3, (head, took)
    rec = p.wait_records(1)[0]
    assert rec["error_kind"] == "client_timeout" and rec["client_status"] == 408
    assert rec["extra"]["timeout_phase"] == "client_body"
    assert fake.seen == []


async def test_fingerprint_probing_is_rate_bounded(fake_stack, tmp_path):
    """Clients choose model names: 200 distinct ones cost one probe, then one per PROBE_GAP."""
    fake = fake_stack("llamacpp")
    async with local_proxy(fake.url, tmp_path / "d", "t") as lp:
        await lp.fingerprint(None)
        per_probe = len(fake.probes)
        assert per_probe >= len(GET_PROBES) - 1
        for i in range(200):
            probe = await lp.post("/v1/chat/completions", {"model": f"m{i}", "messages": MSGS})
            assert probe.reply.status == 200
        await asyncio.sleep(0.5)
        assert len(fake.probes) <= 2 * per_probe, len(fake.probes)
        assert len(lp.state.stacks.fingerprints) <= 2


async def test_fingerprint_cache_is_size_bounded(fake_stack, tmp_path, monkeypatch):
    fake = fake_stack("llamacpp")
    monkeypatch.setattr(stackwatch, "MAX_MODELS", 3)
    monkeypatch.setattr(stackwatch, "PROBE_GAP", 0.0)
    async with local_proxy(fake.url, tmp_path / "d", "t") as lp:
        await lp.fingerprint(None)
        for i in range(60):
            await lp.post("/v1/chat/completions", {"model": f"m{i}", "messages": MSGS})
        watch = lp.state.stacks
        for _ in range(40):
            if len(watch.fingerprints) == 4 and watch.not_probed:
                break
            await asyncio.sleep(0.05)
        assert len(watch.fingerprints) == 4  # the server and MAX_MODELS models, never more
        assert watch.not_probed > 0
        assert lp.state.snapshot()["stack"]["models_not_probed"] == watch.not_probed


@pytest.mark.parametrize(
    "args, message",
    [
        (("--spill-above", "lots"), "--spill-above 'lots' is not a size"),
        (("--spill-above", "512"), "--spill-above must be at least 1024 bytes"),
        (("--max-body", "1x"), "--max-body '1x' is not a size"),
        (("--upstream-connections", "-1"), "--upstream-connections must be 0 (no limit) or a positive number"),
        (("--client-body-timeout", "0"), "must be positive"),
        (("--run", ""), "--run '' names an empty run"),
    ],
)
def test_bound_flags_are_checked_at_start(tmp_path, args, message):
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
            str(tmp_path / "d"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
