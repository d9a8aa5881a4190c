"""Whatever a client puts in a header, the exchange is recorded, losslessly, and recording goes on."""

from __future__ import annotations

import json

import pytest
from rawhttp import raw_request

JSON = [(b"Content-Type", b"application/json")]


def body_of(size: int) -> bytes:
    pad = "x" * max(0, size - 80)
    return json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": pad}]}).encode()


@pytest.mark.parametrize("durability", ["group", "sync"])
async def test_a_non_utf8_header_byte_is_recorded_and_recording_goes_on(fake_stack, proxy, durability):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--durability", durability)
    for size in (200, 300 * 1024):  # small bodies are serialised on the loop, large ones on the writer thread
        odd = [(b"X-Note", b"caf\xe9"), (b"X-Utf8", b"caf\xc3\xa9"), (b"X-Toolproxy-Tag-note", b"n\xe9e")]
        status, _ = await raw_request(p.url, b"/v1/chat/completions", JSON + odd, body_of(size))
        assert status == 200
        status, _ = await raw_request(p.url, b"/v1/chat/completions", JSON, body_of(size), timeout=10)
        assert status == 200  # recording goes on (in sync mode this hung forever)
    recs = p.wait_records(4)
    assert len(recs) == 4, p.output()
    for rec in recs[0::2]:
        headers = {k: v for k, v in rec["request_headers"]}
        # Header values are the wire bytes, one character per byte (ISO-8859-1).
        assert headers["X-Note"].encode("latin-1") == b"caf\xe9"
        assert headers["X-Utf8"].encode("latin-1") == b"caf\xc3\xa9"
        assert rec["tags"]["note"].encode("latin-1") == b"n\xe9e" and rec["extra"]["latin1_fields"] == ["tags.note"]
    p.wait_written(4)
    status, health = p.health()
    assert status == 200 and health["recording"]["dropped"] == 0 and health["recording"]["written"] == 4
