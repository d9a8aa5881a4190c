"""A body collected as it passes: in memory up to a threshold, beyond it in a temporary file.

Memory per exchange stays near `--spill-above` whatever the body's size; a body that stays
below it (nearly all LLM traffic) never touches the disk or another thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

# The spill files' cipher, loaded with the proxy rather than by its first spill, on the loop.
import cryptography.hazmat.primitives.ciphers  # noqa: F401

from toolproxy.record.spill import SpilledBody

_BATCH = 1024 * 1024


class Spool:
    __slots__ = ("limit", "directory", "parts", "size", "spilled", "_pending")

    def __init__(self, limit: int, directory: str) -> None:
        self.limit = limit
        self.directory = directory
        self.parts: list[bytes] = []
        self.size = 0
        self.spilled: SpilledBody | None = None
        self._pending = None

    def add(self, chunk: bytes) -> Awaitable | None:
        """Keep a chunk; an awaitable when the spill thread is behind (await it before reading more)."""
        self.parts.append(chunk)
        self.size += len(chunk)
        if self.size <= self.limit:
            return None
        return self._spill()

    def _spill(self) -> Awaitable | None:
        if self.spilled is None:
            self.spilled = SpilledBody(self.directory)
        if self.size - self.spilled.size < min(self.limit, _BATCH):
            return None
        previous = self._pending
        self._pending = self.spilled.write(b"".join(self.parts))
        self.parts.clear()
        if previous is not None and not previous.done():
            return asyncio.wrap_future(previous)
        return None

    def finish(self) -> bytes | SpilledBody:
        """The whole body: bytes, or a SpilledBody whose `ready` resolves when the file is complete."""
        if self.spilled is None:
            return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        if self.parts:
            self.spilled.write(b"".join(self.parts))
            self.parts.clear()
        self.spilled.close()
        return self.spilled


async def file_payload(body: SpilledBody) -> AsyncIterator[bytes]:
    """A spilled request body for the upstream, read in pieces off the event loop.

    It goes with `Content-Length: len(body)`, which aiohttp does not check: an upstream owed
    bytes that never come waits for them, and the exchange with it hangs. A shortfall fails the
    request here instead (a 502 naming it).
    """
    loop = asyncio.get_running_loop()
    pieces = body.chunks()
    sent = 0
    while True:
        piece = await loop.run_in_executor(None, next, pieces, None)
        if piece is None:
            break
        sent += len(piece)
        yield piece
    if sent != len(body):
        raise RuntimeError(f"a spilled request body read back {sent} of its {len(body)} bytes")
