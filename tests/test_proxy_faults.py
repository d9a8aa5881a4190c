"""Every way an exchange can go wrong gives the client the right answer and leaves exactly one record."""

from __future__ import annotations

import asyncio
import base64
import json
import socket

import aiohttp
import pytest

from toolproxy.emulators import close_mid_stream, gzipped, raw, stall, text
from toolproxy.record.model import body_bytes

MSGS = [{"role": "user", "content": "hi"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def only_record(p, **expected) -> dict:
    recs = p.wait_records(1)
    assert len(recs) == 1, recs
    rec = recs[0]
    for k, v in expected.items():
        assert rec[k] == v, (k, rec[k], v)
    return rec


async def post(url: str, body: dict | bytes, **kw) -> tuple[int, dict, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(url, data=data, headers={"Content-Type": "application/json"}, **kw) as r:
            return r.status, dict(r.headers), await r.read()


async def test_upstream_unreachable_is_a_502_naming_upstream_and_cause(proxy):
    upstream = f"http://127.0.0.1:{free_port()}"
    p = proxy(upstream, "--quiet", "--connect-timeout", "2")
    status, headers, body = await post(p.url + "/v1/chat/completions", {"model": "m", "messages": MSGS})
    assert status == 502 and headers["Content-Type"].startswith("application/json")
    err = json.loads(body)["error"]
    assert upstream in err["message"] and "refused" in err["message"].lower()
    assert err["code"] == "upstream_unreachable" and set(err) == {"message", "type", "param", "code"}
    rec = only_record(p, error_kind="connect", status=None, client_status=502)
    assert upstream in rec["error_message"] and rec["client_body"] == body.decode()


async def test_no_first_byte_in_time_is_a_504(fake_stack, proxy):
    fake = fake_stack("vllm", tool_parser="hermes")
    fake.inject(stall(before=3))
    p = proxy(fake.url, "--quiet", "--ttfb-timeout", "0.4")
    status, _, body = await post(p.url + "/v1/chat/completions", {"model": fake.model, "messages": MSGS})
    assert status == 504
    err = json.loads(body)["error"]
    assert err["code"] == "upstream_timeout" and fake.url in err["message"] and "--ttfb-timeout" in err["message"]
    rec = only_record(p, error_kind="timeout", client_status=504)
    assert rec["extra"]["timeout_phase"] == "first_byte"


async def test_idle_gap_mid_stream_cuts_the_stream_and_says_so(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.enqueue(text("a b c d"))
    fake.inject(stall(between=3))
    p = proxy(fake.url, "--quiet", "--idle-timeout", "0.4")
    got = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with aiohttp.ClientSession() as s:
            async with s.post(
                p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": MSGS, "stream": True}
            ) as r:
                assert r.status == 200
                async for chunk in r.content.iter_any():
                    got += chunk
    rec = only_record(p, error_kind="timeout", status=200, response_complete=False)
    assert rec["extra"]["timeout_phase"] == "idle"
    assert got.startswith(b"data: ") and body_bytes(rec["response_body"], rec["response_body_encoding"]) == got


async def test_total_timeout_caps_a_slow_stream(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.enqueue(text("a b c d e f g h"))
    fake.inject(stall(between=0.2))
    p = proxy(fake.url, "--quiet", "--total-timeout", "0.5")
    with pytest.raises(aiohttp.ClientPayloadError):
        async with aiohttp.ClientSession() as s:
            async with s.post(
                p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": MSGS, "stream": True}
            ) as r:
                await r.read()
    rec = only_record(p, error_kind="timeout")
    assert rec["extra"]["timeout_phase"] == "total"


async def test_upstream_closing_mid_stream_is_passed_on(fake_stack, proxy):
    fake = fake_stack("vllm", tool_parser="hermes")
    fake.enqueue(text("one two three four five"))
    fake.inject(close_mid_stream(after=3))
    p = proxy(fake.url, "--quiet")
    got = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with aiohttp.ClientSession() as s:
            async with s.post(
                p.url + "/v1/chat/completions", json={"model": fake.model, "messages": MSGS, "stream": True}
            ) as r:
                async for chunk in r.content.iter_any():
                    got += chunk
    assert got == fake.seen[-1].sent and got.count(b"data: ") == 3  # exactly the upstream's bytes, then the cut
    rec = only_record(p, error_kind="upstream_closed", status=200, response_complete=False)
    assert body_bytes(rec["response_body"], rec["response_body_encoding"]) == got


async def test_upstream_closing_mid_body_without_streaming(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    fake.inject(close_mid_stream(after=25))
    p = proxy(fake.url, "--quiet")
    with pytest.raises(aiohttp.ClientPayloadError):
        await post(p.url + "/v1/chat/completions", {"model": "m", "messages": MSGS})
    rec = only_record(p, error_kind="upstream_closed", status=200)
    assert body_bytes(rec["response_body"], rec["response_body_encoding"]) == fake.seen[-1].sent


async def test_client_disconnect_mid_stream_cancels_the_upstream(fake_stack, proxy):
    fake = fake_stack("ollama")
    fake.enqueue(text("w " * 40))
    fake.inject(stall(between=0.1))
    p = proxy(fake.url, "--quiet")
    async with aiohttp.ClientSession() as s:
        r = await s.post(p.url + "/api/chat", json={"model": "qwen2.5:7b", "messages": MSGS})
        first = await r.content.readany()
        assert first.startswith(b'{"model":"qwen2.5:7b"')
        r.close()  # hang up
    rec = only_record(p, error_kind="client_closed", status=200, response_complete=False)
    assert body_bytes(rec["response_body"], rec["response_body_encoding"]).startswith(first)
    for _ in range(100):
        if fake.disconnected.is_set():
            break
        await asyncio.sleep(0.02)
    assert fake.seen[-1].outcome == "disconnected"  # the proxy hung up on the upstream too
    assert fake.seen[-1].sent.count(b"\n") < 40


async def test_non_utf8_and_non_json_bodies_are_recorded_losslessly(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    garbage = b"\xff\xfe\x00<html>not json \xc3\x28</html>"
    fake.inject(raw(garbage, status=502, content_type="text/html"))
    p = proxy(fake.url, "--quiet")
    req = b'{"model": "m", "prompt": "\xff\xfe bad utf8"}'
    status, headers, body = await post(p.url + "/completion", req)
    assert (status, body, headers["Content-Type"]) == (502, garbage, "text/html")
    rec = only_record(p, status=502, response_body_encoding="base64", request_body_encoding="base64")
    assert base64.b64decode(rec["response_body"]) == garbage and base64.b64decode(rec["request_body"]) == req
    assert fake.seen[-1].body == req


async def test_gzip_responses_pass_through_still_compressed(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.inject(gzipped())
    p = proxy(fake.url, "--quiet")
    status, headers, body = await post(
        p.url + "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS, "stream": True}
    )
    assert status == 200 and headers["Content-Encoding"] == "gzip" and body == fake.seen[-1].sent
    rec = only_record(p, status=200, response_body_encoding="base64")
    assert base64.b64decode(rec["response_body"]) == body


async def test_failures_then_success_are_separate_exchanges(fake_stack, proxy):
    fake = fake_stack("sglang")
    fake.fail(2, 500, "scheduler crashed")
    p = proxy(fake.url, "--quiet")
    statuses = [
        (await post(p.url + "/v1/chat/completions", {"model": fake.model, "messages": MSGS}))[0] for _ in range(3)
    ]
    assert statuses == [500, 500, 200]
    recs = p.wait_records(3)
    assert [r["status"] for r in recs] == [500, 500, 200] and all(r["error_kind"] is None for r in recs)
    assert json.loads(recs[0]["response_body"]) == {
        "object": "error",
        "message": "scheduler crashed",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }


async def test_body_above_max_body_is_a_413_and_recorded(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--max-body", "2k")
    big = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 5000}]}
    status, _, body = await post(p.url + "/v1/chat/completions", big)
    assert status == 413 and "--max-body" in json.loads(body)["error"]["message"]
    rec = only_record(p, error_kind="body_too_large", client_status=413)
    assert rec["request_body_size"] > 2048
    assert fake.seen == []  # never forwarded
    status, _, _ = await post(p.url + "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS})
    assert status == 200  # the connection pool and the proxy are fine afterwards


async def test_total_timeout_holds_even_while_the_upstream_is_silent(fake_stack, proxy):
    """--total-timeout caps the exchange although no chunk arrives to trigger a check (idle is long)."""
    fake = fake_stack("openai")
    fake.enqueue(text("a b c"))
    fake.inject(stall(between=4))
    p = proxy(fake.url, "--quiet", "--total-timeout", "0.6", "--idle-timeout", "30")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(aiohttp.ClientPayloadError):
        async with aiohttp.ClientSession() as s:
            async with s.post(
                p.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": MSGS, "stream": True}
            ) as r:
                await r.read()
    assert loop.time() - t0 < 2.5
    rec = only_record(p, error_kind="timeout")
    assert rec["extra"]["timeout_phase"] == "total"


async def test_total_timeout_also_bounds_the_wait_for_the_first_byte(fake_stack, proxy):
    fake = fake_stack("openai")
    fake.inject(stall(before=4))
    p = proxy(fake.url, "--quiet", "--total-timeout", "0.5")  # --ttfb-timeout keeps its 600 s default
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    status, _, _ = await post(p.url + "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS})
    assert status == 504 and loop.time() - t0 < 2.5
    only_record(p, error_kind="timeout")
