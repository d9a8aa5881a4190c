"""A byte-exact HTTP/1.1 client for tests that must send what well-behaved clients refuse to
(header values that are not UTF-8, odd tokens); real sockets, nothing simulated."""

from __future__ import annotations

import asyncio

from yarl import URL


async def raw_request(
    url: str,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
    method: bytes = b"POST",
    timeout: float = 15.0,
) -> tuple[int, bytes]:
    """(status, whole response bytes) for one request on its own connection."""
    u = URL(url)
    reader, writer = await asyncio.open_connection(u.host, u.port)
    head = [
        method + b" " + target + b" HTTP/1.1",
        b"Host: " + u.host.encode(),
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
    ]
    head += [k + b": " + v for k, v in headers]
    writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
    try:
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    return int(data.split(b" ", 2)[1]), data
