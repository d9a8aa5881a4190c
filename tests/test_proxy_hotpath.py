"""What the hot path's shortcuts must not change: headers go out when the upstream sends them,
bytes arrive exactly, and every exchange still leaves its record.

The upstream here is raw asyncio so the test decides exactly which bytes arrive together: a
server that sends its headers at once and the body after a pause (vLLM's streaming responses
start this way, before the first token), and one whose headers and body share a packet.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import aiohttp
import pytest

from toolproxy.record.model import body_bytes

BODY = (
    b'{"id":"chatcmpl-1","object":"chat.completion",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}'
)
PAUSE = 1.0


class Upstream(asyncio.Protocol):
    def connection_made(self, transport):
        self.t = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].decode("latin-1")
        length = int(
            next((line.split(":")[1] for line in head.split("\r\n") if line.lower().startswith("content-length")), "0")
        )
        if len(self.buf) < head_end + 4 + length:
            return
        self.buf = b""
        path = head.split(" ")[1]
        if path.endswith("/late-body"):
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY))
            asyncio.get_running_loop().call_later(PAUSE, self.t.write, BODY)
        elif path.endswith("/chunked"):
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (BODY[:10], BODY[10:]))
            self.t.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                + chunks
                + b"0\r\n\r\n"
            )
        else:
            self.t.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Upstream: one-packet\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
            )


@pytest.fixture(scope="module")
def upstream():
    loop = asyncio.new_event_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    started = threading.Event()
    stop = asyncio.Event()

    async def main():
        server = await loop.create_server(Upstream, sock=sock)
        started.set()
        async with server:
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    started.wait(5)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    loop.call_soon_threadsafe(stop.set)
    thread.join(5)
    loop.close()


async def test_headers_go_out_when_they_arrive_not_with_a_late_body(upstream, proxy):
    p = proxy(upstream, "--quiet", "--no-fingerprint")
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        async with s.post(p.url + "/v1/late-body", data=b"{}") as r:
            headers_after = time.monotonic() - t0
            body = await r.read()
        body_after = time.monotonic() - t0
    assert r.status == 200 and body == BODY
    assert headers_after < PAUSE / 2, f"headers waited {headers_after:.2f}s for the body"
    assert body_after >= PAUSE * 0.9
    (rec,) = p.wait_records(1)
    assert body_bytes(rec["response_body"], rec["response_body_encoding"]) == BODY and rec["response_complete"]


async def test_a_response_that_arrives_whole_is_passed_on_exactly_and_recorded_once_each(upstream, proxy):
    p = proxy(upstream, "--quiet", "--no-fingerprint")
    async with aiohttp.ClientSession() as s:

        async def one(path: str) -> tuple[int, dict, bytes]:
            async with s.post(p.url + path, data=b'{"n": 1}', headers={"Authorization": "Bearer sk-hot"}) as r:
                return r.status, dict(r.headers), await r.read()

        results = await asyncio.gather(*(one("/v1/one-packet" if i % 2 else "/v1/chunked") for i in range(60)))
    for i, (status, headers, body) in enumerate(results):
        assert status == 200 and body == BODY
        if i % 2:
            assert headers["X-Upstream"] == "one-packet" and headers["Content-Length"] == str(len(BODY))
        else:
            assert headers.get("Transfer-Encoding") == "chunked"
    recs = p.wait_records(60)
    assert len(recs) == 60 and len({r["id"] for r in recs}) == 60
    for rec in recs:
        assert body_bytes(rec["response_body"], rec["response_body_encoding"]) == BODY
        assert dict(rec["request_headers"])["Authorization"].startswith("redacted:")
        assert dict(rec["response_headers"])["Content-Type"] == "application/json"
