"""Less common wire situations a transparent proxy still has to get exactly right."""

from __future__ import annotations

import asyncio
import http.client
import json
from urllib.parse import urlsplit

import aiohttp
import pytest

from toolproxy.emulators import Fault, raw, stall, text
from toolproxy.record.model import body_bytes

MSGS = [{"role": "user", "content": "hi"}]


def fetch(url: str, method: str, target: str) -> tuple[http.client.HTTPResponse, bytes]:
    """One request on its own connection with http.client, which sends the target exactly as given."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request(method, target)
        r = conn.getresponse()
        return r, r.read()
    finally:
        conn.close()


def test_percent_encoding_in_path_and_query_is_preserved(fake_stack, proxy):
    fake = fake_stack("vllm")
    p = proxy(fake.url, "--quiet")
    r, _ = fetch(p.url, "GET", "/t/run=a%20b/v1/models/Qwen%2FQwen2.5-7B?a=%2F&b=1+2&c=%E2%9C%93")
    assert fake.seen[-1].raw_path == "/v1/models/Qwen%2FQwen2.5-7B?a=%2F&b=1+2&c=%E2%9C%93"
    (rec,) = p.wait_records(1)
    assert rec["run"] == "a b" and rec["path"] == "/v1/models/Qwen%2FQwen2.5-7B" and rec["status"] == r.status == 404


def test_repeated_response_headers_and_redirects_pass_through_unfollowed(fake_stack, proxy):
    fake = fake_stack("openai")
    attacker = fake_stack("openai")
    fake.inject(
        Fault(
            status=302,
            body=b"",
            content_type="text/plain",
            headers=(
                ("Location", attacker.url + "/v1/models"),
                ("Set-Cookie", "a=SECRET-C1"),
                ("Set-Cookie", "b=SECRET-C2"),
            ),
        )
    )
    p = proxy(fake.url, "--quiet")
    r, _ = fetch(p.url, "GET", "/v1/models")
    assert r.status == 302 and r.getheader("Location") == attacker.url + "/v1/models"
    assert r.headers.get_all("Set-Cookie") == ["a=SECRET-C1", "b=SECRET-C2"]
    assert attacker.seen == []
    (rec,) = p.wait_records(1)
    cookies = [v for k, v in rec["response_headers"] if k.lower() == "set-cookie"]
    assert len(cookies) == 2 and all(v.startswith("redacted:") for v in cookies) and cookies[0] != cookies[1]


def test_head_request(fake_stack, proxy):
    fake = fake_stack("ollama")
    p = proxy(fake.url, "--quiet")
    r, body = fetch(p.url, "HEAD", "/")
    assert r.status == 200 and body == b""
    assert fake.seen[-1].method == "HEAD"
    (rec,) = p.wait_records(1)
    assert rec["method"] == "HEAD" and rec["status"] == 200 and rec["error_kind"] is None


async def test_client_hanging_up_before_the_first_byte_cancels_the_upstream(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    fake.inject(stall(before=5))
    p = proxy(fake.url, "--quiet")
    async with aiohttp.ClientSession() as s:
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(
                p.url + "/v1/chat/completions",
                json={"model": "m", "messages": MSGS},
                timeout=aiohttp.ClientTimeout(total=0.5),
            ):
                pass
    (rec,) = p.wait_records(1)
    assert rec["error_kind"] == "client_closed" and rec["status"] is None
    for _ in range(100):
        if fake.disconnected.is_set():
            break
        await asyncio.sleep(0.02)
    assert fake.seen[-1].outcome == "disconnected"


async def test_large_bodies_both_ways(fake_stack, proxy):
    fake = fake_stack("openai")
    big_reply = ("w" * 2000 + " ") * 1000  # 2 MB of content in 1000 pieces, streamed and not
    fake.enqueue(text(big_reply), text(big_reply))
    p = proxy(fake.url, "--quiet")
    big_prompt = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 3_000_000}]}
    async with aiohttp.ClientSession() as s:
        for stream in (False, True):
            async with s.post(p.url + "/v1/chat/completions", json={**big_prompt, "stream": stream}) as r:
                got = await r.read()
            assert r.status == 200 and got == fake.seen[-1].sent
    recs = p.wait_records(2)
    assert [len(body_bytes(r["response_body"], r["response_body_encoding"])) for r in recs] == [
        len(s.sent) for s in fake.seen
    ]
    assert all(r["request_body_size"] > 3_000_000 for r in recs)


async def test_chunked_request_upload_is_forwarded_intact(fake_stack, proxy):
    fake = fake_stack("sglang")
    p = proxy(fake.url, "--quiet")
    payload = json.dumps({"model": "m", "messages": MSGS}).encode()

    async def gen():
        for i in range(0, len(payload), 7):
            yield payload[i : i + 7]

    async with aiohttp.ClientSession() as s:
        async with s.post(
            p.url + "/v1/chat/completions", data=gen(), headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 200
            await r.read()
    assert fake.seen[-1].body == payload


async def test_non_json_error_page_from_upstream(fake_stack, proxy):
    fake = fake_stack("vllm")
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>\r\n"
    fake.inject(raw(page, status=502, content_type="text/html"))
    p = proxy(fake.url, "--quiet")
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json={"model": "m", "messages": MSGS}) as r:
            assert (r.status, await r.read(), r.headers["Content-Type"]) == (502, page, "text/html")
    (rec,) = p.wait_records(1)
    assert rec["status"] == 502 and rec["error_kind"] is None and rec["response_body"] == page.decode()
