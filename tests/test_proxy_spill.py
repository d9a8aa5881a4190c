"""Bodies above --spill-above wait in a temporary file: the proxy's memory does not grow with
body size, and the record still holds every byte, exactly as if the body had been kept."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import aiohttp
import orjson
import pytest

from toolproxy.emulators import raw, text
from toolproxy.proxy.spool import file_payload
from toolproxy.record.model import Record, body_bytes, encode_body
from toolproxy.record.spill import SpilledBody, record_pieces


def _spilled(data: bytes, directory: str | None, piece: int) -> SpilledBody:
    body = SpilledBody(directory)
    for i in range(0, len(data), piece):
        body.write(data[i : i + piece])
    body.close().result()
    return body


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b'plain ascii "quoted" \\ and\nnewlines\t' * 5000,
        "caf\u00e9 \u2603 \U0001f600 split across pieces ".encode() * 40000,  # multi-byte chars cut by piece edges
        b"\x00\x1f\x7f control characters" * 1000,
        os.urandom(1_000_003),  # not UTF-8: base64, with a length that is not a multiple of 3
        b"\xff" + b"a" * 70_000,
        b"last piece smaller than a file buffer " * 3_473,  # 2 x 65,537 + 900 bytes: the 900 must reach the file too
    ],
)
@pytest.mark.parametrize("writable", [True, False])
def test_a_spilled_body_serialises_exactly_like_a_held_one(tmp_path, data, writable):
    # An unwritable spill directory (a file in its place) keeps the rest in memory instead of losing it.
    directory = tmp_path / "spill"
    if not writable:
        directory.write_bytes(b"")
    rec = Record(id="x", started_at=1.0, request_headers=[["X-Note", "toolproxy-spilled-request_body"]])
    rec.request_body = _spilled(data, str(directory), 65_537)
    rec.response_body = _spilled(data[::-1], str(directory), 100_003)
    assert (rec.request_body.error is None) is (writable or not data)
    streamed = b"".join(record_pieces(rec))

    held = Record(id="x", started_at=1.0, request_headers=[["X-Note", "toolproxy-spilled-request_body"]])
    held.request_body, held.request_body_encoding = encode_body(data)
    held.response_body, held.response_body_encoding = encode_body(data[::-1])
    assert streamed == orjson.dumps(held, option=orjson.OPT_APPEND_NEWLINE)
    line = orjson.loads(streamed)
    assert body_bytes(line["request_body"], line["request_body_encoding"]) == data


# A request the proxy never answers fails its test after this long, saying so, rather than at
# pytest's timeout: nothing here takes a tenth of it even on a loaded machine.
_ANSWER_WITHIN = 120


def _unanswered(fake, sent: int) -> str:
    return (
        f"the proxy did not answer within {_ANSWER_WITHIN}s; the upstream received {len(fake.seen)} of "
        f"{sent} requests whole"
    )


async def test_a_spilled_request_body_that_reads_back_short_fails_instead_of_leaving_the_upstream_waiting(tmp_path):
    body = _spilled(b"q" * 300_000, str(tmp_path), 65_536)
    assert b"".join([piece async for piece in file_payload(body)]) == b"q" * 300_000
    os.ftruncate(body.file.fileno(), 299_000)
    with pytest.raises(RuntimeError, match="read back 299000 of its 300000 bytes"):
        [piece async for piece in file_payload(body)]


def _hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def test_large_bodies_pass_through_in_bounded_memory_and_are_recorded_whole(fake_stack, proxy):
    reply_text = "r\u00e9ponse " * (2_500_000)  # ~22 MB of JSON-escaped UTF-8 per response
    fake = fake_stack("openai")
    fake.responder = lambda req: text(reply_text)
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--spill-above", "256KiB")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_ANSWER_WITHIN)) as s:
        async with s.post(
            p.url + "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        ) as r:
            await r.read()  # warm up: the baseline includes everything a first exchange loads
        base = _hwm_kb(p.proc.pid)

        async def one(i: int) -> tuple[bytes, bytes]:
            sent = json.dumps(
                {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"{i} " + "x\u00e9" * 5_000_000}]}
            ).encode()
            async with s.post(
                p.url + "/v1/chat/completions", data=sent, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 200
                return sent, await r.read()

        try:
            results = await asyncio.gather(*(one(i) for i in range(3)))
        except TimeoutError:
            pytest.fail(_unanswered(fake, 4), pytrace=False)
    recs = p.wait_records(4, timeout=30)
    grown_mb = (_hwm_kb(p.proc.pid) - base) / 1024
    # 3 x (~10 MB request + ~22 MB response) passed at once; held in memory they took several times that.
    assert grown_mb < 60, grown_mb
    by_body = {r["request_body"].encode(): r for r in recs}  # file order is not submission order
    for sent, got in results:
        rec = by_body[sent]
        assert rec["request_body_encoding"] == "utf8" and rec["request_body_size"] == len(sent)
        assert rec["response_body"].encode() == got and rec["response_complete"]
        assert json.loads(got)["choices"][0]["message"]["content"] == reply_text
    assert sorted(s.body for s in fake.seen[1:]) == sorted(sent for sent, _ in results)  # forwarded byte for byte
    assert not list((p.data / "spill").iterdir())  # unnamed temporary files: nothing left behind


async def test_a_spilled_request_whose_last_piece_is_small_is_forwarded_and_recorded_whole(fake_stack, proxy):
    """The spool's last write to the file is a few bytes: they reach the upstream and the record too."""
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--spill-above", "1KiB")
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "z" * 300_000}]}).encode()

    async def pieces():
        yield body[:-10]
        await asyncio.sleep(0.2)  # the last 10 bytes arrive alone, so the spool writes them alone
        yield body[-10:]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_ANSWER_WITHIN)) as s:
        try:
            async with s.post(
                p.url + "/v1/chat/completions",
                data=pieces(),
                headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
            ) as r:
                assert r.status == 200
        except TimeoutError:
            pytest.fail(_unanswered(fake, 1), pytrace=False)
    assert [seen.body for seen in fake.seen] == [body]
    rec = p.wait_records(1)[0]
    assert rec["request_body"].encode() == body and rec["request_body_size"] == len(body)


async def test_a_large_binary_response_is_recorded_as_base64(fake_stack, proxy):
    blob = os.urandom(3_000_001)
    fake = fake_stack("openai")
    fake.inject(raw(blob, content_type="application/octet-stream"))
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--spill-above", "64KiB")
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": []}) as r:
            assert await r.read() == blob
    rec = p.wait_records(1)[0]
    assert rec["response_body_encoding"] == "base64" and base64.b64decode(rec["response_body"]) == blob


async def test_spilled_and_deduplicated_records_share_a_segment(fake_stack, proxy):
    """Bodies stored as chunks before and after a spilled one all read back byte for byte."""
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--spill-above", "64KiB", "--commit-window", "1")
    history = [{"role": "user", "content": f"turn {i} " + "words " * 200} for i in range(20)]
    bodies = [
        json.dumps({"model": "gpt-4o-mini", "messages": history[:10]}).encode(),  # ~13 KB: chunked
        json.dumps(
            {"model": "gpt-4o-mini", "messages": history[:10] + [{"role": "user", "content": "z" * 200_000}]}
        ).encode(),
        json.dumps({"model": "gpt-4o-mini", "messages": history}).encode(),  # shares the first's prefix
    ]
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(
            *(
                s.post(p.url + "/v1/chat/completions", data=b, headers={"Content-Type": "application/json"})
                for b in bodies
            )
        )
    recs = p.wait_records(3)
    assert sorted(r["request_body"].encode() for r in recs) == sorted(bodies)
    segments = list((p.data / "segments").glob("*.jsonl"))
    assert len(segments) == 1 and b'{"kind":"chunk"' in segments[0].read_bytes()  # dedup did its part


async def test_bodies_below_the_threshold_never_touch_the_spill_directory(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--spill-above", "64KiB")
    async with aiohttp.ClientSession() as s:
        for stream in (False, True):
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "y" * 60_000}], "stream": stream}
            async with s.post(p.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
    assert len(p.wait_records(2)) == 2
    assert not (p.data / "spill").exists()
