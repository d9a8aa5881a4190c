"""Refused requests (no token, a disk budget reached, what the HTTP parser rejects): every one
counted, recorded only within a bounded budget of their own that can never push an exchange's
record out. Real proxies, real clients and sockets."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlsplit

import aiohttp
import pytest

from toolproxy.proxy import refusals
from toolproxy.proxy.headers import Redactor
from toolproxy.proxy.refusals import HEADER_CHARS, TEXT_CHARS, bound_fields, bounded_headers
from toolproxy.record.model import Record
from toolproxy.record.segments import list_segments, read_records, read_segment

TOKEN = "tok-refusals-777"
BUDGET = 512 * 1024
SEGMENT = 32 * 1024
REDACTOR = Redactor(b"k" * 32)


def segment_bytes(data) -> int:
    total = 0
    for seg in list_segments(data):
        try:
            total += seg.stat().st_size
        except FileNotFoundError:  # pruned meanwhile
            pass
    return total


async def wait_for(predicate, what: str, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return value


async def test_clients_without_the_token_neither_fill_the_disk_nor_get_recordings_pruned(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(
        fake.url,
        "--quiet",
        "--no-fingerprint",
        "--auth-token",
        TOKEN,
        "--segment-size",
        str(SEGMENT),
        "--max-disk",
        str(BUDGET),
    )
    url = p.url + "/v1/chat/completions"
    async with aiohttp.ClientSession(headers={"X-Toolproxy-Token": TOKEN}) as s:
        for i in range(20):
            async with s.post(
                url, json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"kept-{i:02d}"}]}
            ) as r:
                assert r.status == 200
    assert len(p.wait_records(20)) == 20

    # Then clients without the token, as fast as they can, each request with 64 KB of headers.
    filler = {f"X-Filler-{i}": "f" * 8000 for i in range(8)}
    sent = 0
    peak = 0
    end = time.monotonic() + 1.5

    async def flood(s: aiohttp.ClientSession) -> None:
        nonlocal sent
        while time.monotonic() < end:
            async with s.post(
                url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]}, headers=filler
            ) as r:
                await r.read()
                assert r.status == 401
                sent += 1

    async def watch() -> None:
        nonlocal peak
        while time.monotonic() < end + 0.5:
            peak = max(peak, segment_bytes(p.data))
            await asyncio.sleep(0.01)

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as s:
        await asyncio.gather(watch(), *(flood(s) for _ in range(16)))
    elapsed = time.monotonic() - started

    # No recording was pruned to make room for refusals.
    kept = sorted(
        json.loads(r["request_body"])["messages"][0]["content"] for r in p.records() if r["client_status"] == 200
    )
    assert kept == [f"kept-{i:02d}" for i in range(20)]
    assert sent > 2 * refusals.RECORDS, f"only {sent} refused requests: the flood did not test the budget"
    stats = await wait_for(
        lambda: (s := p_stats(p))["refused"]["written"] == s["refused"]["recorded"] and s,
        "the recorded refusals to be written",
    )
    refused = stats["refused"]
    assert refused["by_kind"] == {"unauthorized": sent, "admin_unauthorized": 1}  # + the start-up health check
    assert refused["recorded"] + refused["not_recorded"] == sent
    intervals = int(elapsed // refusals.INTERVAL) + 2  # the windows the flood can have touched
    assert 0 < refused["recorded"] <= refusals.RECORDS * intervals
    assert refused["truncated"] == refused["recorded"] and refused["dropped"] == 0
    assert stats["recording"]["written"] == 20 and stats["lifecycle"]["pruned_segments"] == 0

    # The refusals' own segments are capped (the oldest go), and every record in them is bounded.
    cap = (refusals.KEEP + 1) * refusals.segment_bytes(SEGMENT)
    assert peak <= BUDGET + cap, (peak, BUDGET + cap)
    refused_recs = [r for r in read_records(p.data, "exchange") if r["error_kind"] == "unauthorized"]
    assert 0 < len(refused_recs) <= refused["recorded"]
    for rec in refused_recs:
        assert sum(len(k) + len(v) for k, v in rec["request_headers"]) <= HEADER_CHARS
        assert rec["extra"]["truncated"]["request_headers"] > 64_000
        assert rec["request_body"] is None and rec["client_status"] == 401
    for seg in list_segments(p.data):  # each kind in segments of its own
        statuses = {line.record["client_status"] for line in read_segment(seg) if line.record is not None}
        assert statuses <= ({401} if seg.name.endswith(".refused.jsonl") else {200}), (seg.name, statuses)
    assert len(fake.seen) == 20  # refused requests never leave the proxy


def p_stats(p) -> dict:
    import urllib.request

    req = urllib.request.Request(p.url + "/_toolproxy/stats", headers={"X-Toolproxy-Token": TOKEN})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def exchange(sock_url: str, data: bytes) -> bytes:
    u = urlsplit(sock_url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


async def test_requests_the_parser_rejects_are_counted_and_recorded_without_their_bytes(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--no-fingerprint")
    secret = b"sk-SECRETSECRETSECRET"
    bad = [
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header: " + secret + b"\r\n\r\n",  # a space in a header name
        b"GET /v1/models?key=" + secret + b" HTTP/1.1\r\nHost: x\r\n\x01: y\r\n\r\n",  # a control byte as a name
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Long: " + secret * 500 + b"\r\n\r\n",  # over the field size limit
    ]
    for data in bad:
        assert exchange(p.url, data).split(b"\r\n")[0].split()[1] == b"400"
    stats = p.stats()
    assert stats["refused"]["by_kind"] == {"parser_rejected": 3}
    assert stats["refused"]["recorded"] == 3 and stats["exchanges"] == 0
    recs = await wait_for(lambda: len(r := p.records()) == 3 and r, "the rejections' records")
    assert {r["error_kind"] for r in recs} == {"parser_rejected"} and {r["client_status"] for r in recs} == {400}
    assert all("HTTP parser rejected the request" in r["error_message"] for r in recs)
    assert all(r["request_headers"] == [] and r["path"] == "" and r["request_body"] is None for r in recs)
    p.stop()
    stored = b"".join(seg.read_bytes() for seg in list_segments(p.data))
    assert secret not in stored and b"SECRET" not in stored
    assert fake.seen == []


@pytest.mark.parametrize(
    "raw, limit, stored, cut",
    [
        # under the bound: kept as sent, nothing noted
        ([(b"Host", b"a"), (b"X-A", b"bc")], 100, [["Host", "a"], ["X-A", "bc"]], None),
        # the header that does not fit is cut to the room left, the rest left out; cut = all they took
        ([(b"Host", b"abcdef"), (b"X-A", b"0123456789"), (b"X-B", b"z")], 16, [["Host", "abcdef"], ["X-A", "012"]], 27),
        # a name longer than the room left is cut too
        ([(b"Host", b"abcdef"), (b"X-Longer-Name", b"v")], 14, [["Host", "abcdef"], ["X-Lo", ""]], 24),
        # a secret is redacted before anything is cut: never a hash of its first characters
        ([(b"Authorization", b"Bearer sk-" + b"k" * 60)], 20, [["Authorization", "redacte"]], 83),
        # wire bytes read as ISO-8859-1, one character per byte
        ([(b"X-A", b"caf\xc3\xa9")], 100, [["X-A", "caf\xc3\xa9"]], None),
    ],
)
def test_bounded_headers(raw, limit, stored, cut):
    assert bounded_headers(raw, REDACTOR, limit) == (stored, cut)


def test_bounded_headers_redacts_a_secret_that_fits_whole():
    headers, cut = bounded_headers([(b"X-Api-Key", b"sk-live-123")], REDACTOR, HEADER_CHARS)
    assert cut is None and headers == [["X-Api-Key", REDACTOR.value(b"sk-live-123")]]
    assert "sk-live" not in headers[0][1]


def test_bound_fields_cuts_what_a_client_chose_and_names_each_cut():
    rec = Record(
        id="x",
        started_at=1.0,
        client_path="/" + "p" * 600,
        path="/v1/chat/completions",
        run="r" * 300,
        tags={f"t{i}": "v" for i in range(12)} | {"t0": "w" * 400},
    )
    cut = bound_fields(rec)
    assert cut == {"client_path": 601, "run": 300, "tags": 12, "tags.t0": 400}
    assert len(rec.client_path) == TEXT_CHARS and rec.path == "/v1/chat/completions" and len(rec.run) == TEXT_CHARS
    assert list(rec.tags) == [f"t{i}" for i in range(refusals.MAX_TAGS)] and rec.tags["t0"] == "w" * TEXT_CHARS
    untouched = Record(id="y", started_at=1.0, path="/v1/models", run="r", tags={"a": "b"})
    assert bound_fields(untouched) == {} and untouched.tags == {"a": "b"}
