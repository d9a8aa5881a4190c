"""WebSocket frames (RFC 6455) read off the bytes a relay passes on, into whole messages.

The proxy passes a WebSocket through as bytes, both directions, exactly as they come: the
handshake, the framing, the client's masks and any compression are the two ends' business. To
record what was said, it reads a copy of each direction here: frames are unmasked, fragments
joined, and messages compressed by `permessage-deflate` (RFC 7692, which Codex negotiates)
inflated, with the window kept across messages unless the handshake turned context takeover off.
Nothing here raises on bad input: a frame that cannot be read ends the reading of that direction
(`broken` says why), never the relay.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import orjson

TEXT = 0x1
BINARY = 0x2
CLOSE = 0x8
PING = 0x9
PONG = 0xA
_CONTINUATION = 0x0
_DEFLATE_TAIL = b"\x00\x00\xff\xff"


@dataclass(slots=True)
class FrameMessage:
    """One whole message: its opcode, its payload (unmasked, joined, inflated) or None when it
    was larger than the reader's limit (`size` is its size on the wire then)."""

    opcode: int
    payload: bytes | None
    size: int


@dataclass(frozen=True, slots=True)
class Deflate:
    """What `permessage-deflate` the handshake agreed on, per direction."""

    client_no_context_takeover: bool = False
    server_no_context_takeover: bool = False


def negotiated_deflate(extensions: str | None) -> Deflate | None:
    """The server's `Sec-WebSocket-Extensions` answer -> its permessage-deflate terms, or None."""
    for offer in (extensions or "").split(","):
        params = [p.strip().lower() for p in offer.split(";")]
        if params and params[0] == "permessage-deflate":
            return Deflate("client_no_context_takeover" in params, "server_no_context_takeover" in params)
    return None


def close_code(payload: bytes | None) -> tuple[int | None, str]:
    """A close frame's status code and reason (RFC 6455 5.5.1)."""
    if not payload or len(payload) < 2:
        return None, ""
    return int.from_bytes(payload[:2], "big"), payload[2:].decode("utf-8", "replace")


def _unmask(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    if not n:
        return payload
    mask = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")).to_bytes(n, "big")


class FrameReader:
    """One direction of a WebSocket connection, fed its bytes in any chunking."""

    def __init__(self, *, deflate: bool = False, no_context_takeover: bool = False, limit: int = 1 << 26) -> None:
        self.deflate = deflate
        self.no_context_takeover = no_context_takeover
        self.limit = limit
        self.broken: str | None = None
        self._buf = bytearray()
        self._parts: list[bytes] = []
        self._size = 0
        self._opcode: int | None = None
        self._compressed = False
        self._inflater = zlib.decompressobj(-15)

    def feed(self, data: bytes) -> list[FrameMessage]:
        if self.broken is not None or not data:
            return []
        self._buf += data
        out: list[FrameMessage] = []
        while True:
            frame = self._frame()
            if frame is None:
                return out
            message = self._message(*frame)
            if message is not None:
                out.append(message)
            if self.broken is not None:
                return out

    def _frame(self) -> tuple[int, int, bytes, int] | None:
        """(fin and rsv1 bits, opcode, payload, wire size) of the next whole frame, or None."""
        buf = self._buf
        if len(buf) < 2:
            return None
        b0, b1 = buf[0], buf[1]
        length = b1 & 0x7F
        at = 2
        if length == 126:
            if len(buf) < 4:
                return None
            length, at = int.from_bytes(buf[2:4], "big"), 4
        elif length == 127:
            if len(buf) < 10:
                return None
            length, at = int.from_bytes(buf[2:10], "big"), 10
        key = None
        if b1 & 0x80:
            if len(buf) < at + 4:
                return None
            key, at = bytes(buf[at : at + 4]), at + 4
        if len(buf) < at + length:
            return None
        payload = bytes(buf[at : at + length])
        del buf[: at + length]
        if key is not None:
            payload = _unmask(payload, key)
        return b0 & 0xC0, b0 & 0x0F, payload, at + length

    def _message(self, bits: int, opcode: int, payload: bytes, size: int) -> FrameMessage | None:
        fin, rsv1 = bool(bits & 0x80), bool(bits & 0x40)
        if opcode >= 0x8:  # control frames stand alone, even between fragments
            return FrameMessage(opcode, payload, size)
        if opcode != _CONTINUATION:
            if self._opcode is not None:
                self.broken = "a new message began before the last one ended"
                return None
            self._opcode, self._compressed = opcode, rsv1 and self.deflate
            self._parts, self._size = [], 0
        elif self._opcode is None:
            self.broken = "a continuation frame with no message to continue"
            return None
        self._size += size
        if self._size <= self.limit:
            self._parts.append(payload)
        if not fin:
            return None
        opcode, self._opcode = self._opcode, None
        if self._size > self.limit:
            if self._compressed and not self.no_context_takeover:
                self.broken = "a compressed message above the limit: the ones after it cannot be inflated"
            return FrameMessage(opcode, None, self._size)
        data = b"".join(self._parts)
        if self._compressed:
            try:
                data = self._inflater.decompress(data + _DEFLATE_TAIL)
            except zlib.error as exc:
                self.broken = f"a compressed message could not be inflated: {exc}"
                return None
            if self.no_context_takeover:
                self._inflater = zlib.decompressobj(-15)
        return FrameMessage(opcode, data, self._size)


def create_as_post(body: bytes | None) -> bytes | None:
    """A Responses WebSocket mode `response.create` message as the `POST /v1/responses` body it
    stands for (the same fields, `stream` made explicit), or None when it is no such message: how
    a recorded WebSocket exchange is sent again over HTTP."""
    try:
        message = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(message, dict) or message.get("type") != "response.create":
        return None
    return orjson.dumps({**{k: v for k, v in message.items() if k != "type"}, "stream": True})
