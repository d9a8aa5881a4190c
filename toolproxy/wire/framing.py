"""Splitting a body into its JSON documents as the bytes arrive, in any chunking.

Four framings carry the protocols: one JSON document (non-streamed bodies), Server-Sent Events
(chat completions, completions, Responses, Messages, Gemini's `alt=sse`; the `event:` name is kept
because Responses and Messages name their events, and several `data:` lines join with a newline as
the SSE standard says), newline-delimited JSON (Ollama's native API), and one JSON array written
element by element (Gemini's `streamGenerateContent` without `alt=sse`). A framer yields
(event name, payload bytes); payloads are parsed by the caller.
"""

from __future__ import annotations

JSON = "json"
SSE = "sse"
NDJSON = "ndjson"
ARRAY = "array"
DONE = b"[DONE]"


class SSEFramer:
    """Incremental SSE: complete events out, the unfinished tail kept for the next chunk."""

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        out: list[tuple[str | None, bytes]] = []
        if b"\n" not in chunk:
            self._buf += chunk
            return out
        text = self._buf + chunk
        if (
            text[:6] == b"data: "
            and text[-2:] == b"\n\n"
            and not self._data
            and self._event is None
            and b"\r" not in text
        ):
            # Whole events of one `data: ` line each (what every stack writes, and a whole body):
            # the payloads are what lies between the separators, when no payload holds a newline.
            payloads = text[6:-2].split(b"\n\ndata: ")
            if text.count(b"\n") == 2 * len(payloads):
                self._buf = b""
                return [(None, payload) for payload in payloads]
        if b"\r" in text:
            *lines, self._buf = text.split(b"\n")
            for line in lines:
                self._line(line[:-1] if line[-1:] == b"\r" else line, out)
            return out
        # No carriage return: split at blank lines, and an event that is one `data: ` line (what
        # every stack writes) is its payload as it stands; any other block goes line by line. The
        # tail after the last newline waits for the next chunk, as in the line-by-line reading.
        end = text.rfind(b"\n") + 1
        self._buf = text[end:]
        *blocks, last = text[:end].split(b"\n\n")
        line = self._line
        for block in blocks:
            if block[:6] == b"data: " and b"\n" not in block and not self._data and self._event is None:
                out.append((None, block[6:]))
            else:
                for piece in block.split(b"\n"):
                    line(piece, out)
                line(b"", out)
        if last:  # the lines of an event not yet ended by a blank line ("" when the text ends with one)
            for piece in last[:-1].split(b"\n"):
                line(piece, out)
        return out

    def close(self) -> list[tuple[str | None, bytes]]:
        out: list[tuple[str | None, bytes]] = []
        rest, self._buf = self._buf, b""
        if rest.strip():
            self._line(rest.rstrip(b"\r"), out)
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list) -> None:
        if line[:6] == b"data: ":  # the common case first
            self._data.append(line[6:])
            return
        if not line:
            if self._data:
                out.append((self._event, self._data[0] if len(self._data) == 1 else b"\n".join(self._data)))
            self._event, self._data = None, []
            return
        if line[:1] == b":":
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace").strip()


class NDJSONFramer:
    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        self._buf += chunk
        if b"\n" not in chunk:
            return []
        *lines, self._buf = self._buf.split(b"\n")
        return [(None, line) for line in lines if line.strip()]

    def close(self) -> list[tuple[str | None, bytes]]:
        rest, self._buf = self._buf, b""
        return [(None, rest)] if rest.strip() else []


class JSONFramer:
    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        self._parts.append(chunk)
        return []

    def close(self) -> list[tuple[str | None, bytes]]:
        body, self._parts = b"".join(self._parts), []
        return [(None, body)] if body.strip() else []


def sniff(head: bytes, content_type: str | None, line_framed: bool, array_framed: bool = False) -> str | None:
    """The framing of a body from its content type, else from its first bytes; None: not yet known.

    `line_framed`: the protocol streams NDJSON (Ollama's native API), where a body of one line is
    also its own non-streamed JSON document, so the two read the same way. `array_framed`: the
    protocol streams one JSON array (Gemini), sent as `application/json` like a single reply, so
    its first byte tells the two apart.
    """
    ct = (content_type or "").lower()
    if "text/event-stream" in ct:
        return SSE
    if "ndjson" in ct:
        return NDJSON
    start = head.lstrip()
    if array_framed and ("json" in ct or start[:1] == b"["):
        if not start:
            return None
        return ARRAY if start[:1] == b"[" else JSON
    if "json" in ct:
        return JSON
    if not start:
        return None
    if start[:1] in (b"{", b"["):
        return NDJSON if line_framed else JSON
    if start[:1] == b":" or any(start.startswith(p[: len(start)]) for p in (b"data:", b"event:", b"id:", b"retry:")):
        return SSE if len(start) >= 6 or start[:1] == b":" else None
    return JSON


class ArrayFramer:
    """A JSON array of documents, each element out as soon as its closing bracket arrives. Only
    strings and nesting are tracked, so elements are split without parsing them; an element that
    is no object or array (a stray number) is skipped, as it could be no reply."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._depth = 0  # 0: outside the array, 1: between elements, >1: inside one
        self._string = False
        self._escape = False
        self._start = -1  # where the element being read starts in _buf

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        out: list[tuple[str | None, bytes]] = []
        base = len(self._buf)
        self._buf += chunk
        buf = self._buf
        for i in range(base, len(buf)):
            c = buf[i]
            if self._string:
                if self._escape:
                    self._escape = False
                elif c == 0x5C:  # backslash
                    self._escape = True
                elif c == 0x22:  # quote
                    self._string = False
                continue
            if c == 0x22:
                self._string = True
            elif c in (0x7B, 0x5B):  # { [
                if self._depth == 1:
                    self._start = i
                self._depth += 1
            elif c in (0x7D, 0x5D):  # } ]
                self._depth -= 1
                if self._depth == 1 and self._start >= 0:
                    out.append((None, bytes(buf[self._start : i + 1])))
                    self._start = -1
                elif self._depth <= 0:
                    self._depth = 0
        if self._start < 0:
            self._buf = bytearray()
        elif self._start:
            del self._buf[: self._start]
            self._start = 0
        return out

    def close(self) -> list[tuple[str | None, bytes]]:
        rest = bytes(self._buf[self._start :]) if self._start >= 0 else b""
        self._buf, self._start = bytearray(), -1
        return [(None, rest)] if rest.strip() else []


FRAMERS = {SSE: SSEFramer, NDJSON: NDJSONFramer, JSON: JSONFramer, ARRAY: ArrayFramer}
