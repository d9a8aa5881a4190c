"""The requests the transparency test sends through every command that starts a proxy, byte for
byte on real sockets: a gzip-encoded body, a header value with obs-text bytes, a head trickled
in pieces. Run as a script it is the harness of `toolproxy run` / `toolproxy study` (the base
URL from TOOLPROXY_BASE_URL, as every harness finds it); imported, the same requests go to any URL.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import sys

from yarl import URL

PATH = "/v1/chat/completions"
CASE_HEADER = b"X-Transparency-Case"
# mtime 0: the same compressed bytes on every run, so the upstream's copy can be compared exactly.
GZIP_BODY = gzip.compress(b'{"model":"m","messages":[{"role":"user","content":"gzip"}]}', mtime=0)
PLAIN_BODY = b'{"model":"m","messages":[{"role":"user","content":"plain"}]}'
ODD_VALUE = b"caf\xe9 \x80\xff-obs-text"
SLOW_PIECES = 4
SLOW_PAUSE = 0.15  # seconds between pieces: far inside the 15 s header timeout


def case_requests() -> dict[str, tuple[list[tuple[bytes, bytes]], bytes, bool]]:
    """{case: (extra headers, body, trickled)}."""
    json_type = (b"Content-Type", b"application/json")
    return {
        "gzip": ([json_type, (b"Content-Encoding", b"gzip")], GZIP_BODY, False),
        "odd_header": ([json_type, (b"X-Odd", ODD_VALUE)], PLAIN_BODY, False),
        "slow_header": ([json_type], PLAIN_BODY, True),
    }


async def send(base: str, case: str) -> int:
    """One case's request on its own connection to `base` (a proxy root, tags allowed); its status."""
    headers, body, trickled = case_requests()[case]
    url = URL(base.rstrip("/") + PATH)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    head = [
        b"POST " + url.raw_path.encode() + b" HTTP/1.1",
        b"Host: " + f"{url.host}:{url.port}".encode(),
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
        CASE_HEADER + b": " + case.encode(),
    ]
    head += [k + b": " + v for k, v in headers]
    wire = b"\r\n".join(head) + b"\r\n\r\n"
    try:
        if trickled:
            step = len(wire) // SLOW_PIECES + 1
            for i in range(0, len(wire), step):
                writer.write(wire[i : i + step])
                await writer.drain()
                await asyncio.sleep(SLOW_PAUSE)
            writer.write(body)
        else:
            writer.write(wire + body)
        data = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    return int(data.split(b" ", 2)[1]) if data else 0


async def send_all(base: str) -> dict[str, int]:
    return {case: await send(base, case) for case in case_requests()}


if __name__ == "__main__":
    statuses = asyncio.run(send_all(os.environ["TOOLPROXY_BASE_URL"]))
    print(statuses)
    sys.exit(0 if all(s == 200 for s in statuses.values()) else 1)
