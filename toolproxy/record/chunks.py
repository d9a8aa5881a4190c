"""Repeated body content stored once per segment: chunk lines, and records that point at them.

Agents resend the whole conversation every turn, so turn 50 of an episode carries turns 1-49
again, and storing bodies whole makes an episode's storage grow with the square of its length.
Instead, the writer thread cuts each large body into chunks, writes every chunk it has not yet
written to the current segment as a line of its own, and writes the record with the body field
null and `<field>_chunks`: the byte offsets of those chunk lines, in order. Concatenated, the
chunks are the body's bytes exactly as they went over the wire; nothing is re-serialised, so any
JSON spelling, any bytes, round-trip.

Chunk line (always written with these keys in this order, so readers can skip it unparsed):

    {"kind":"chunk","id":"<first 16 bytes of the SHA-256 of the bytes, hex>","enc":"zlib"|"utf8"|"base64","data":"..."}

Why these choices:
- Cuts after a `}` followed by `,{` or `]` (whitespace allowed): after each object of a JSON
  array, i.e. after every message, tool and content part, including the last message. The cut
  points of a body depend only on the bytes before them, so the history a harness resends is
  cut exactly as last turn and its chunks are found again, and the tools array after the
  messages re-aligns at once. A regex search is C-speed, where rolling-hash chunking in pure
  Python would hold the GIL, and so the proxy's event loop, for milliseconds per body. A history
  packed before is not even cut again (_RecentBodies). Pieces shorter than MIN_CHUNK are merged
  with what follows (a chunk costs a line); spans without cut points are cut every MAX_CHUNK
  bytes from their start, which is itself a content-defined point.
- Per segment, chunks referenced by byte offset: a chunk always precedes the first record that
  uses it in the same append-only file, so a record can never be on disk without its chunks (a
  crash can only tear the tail), a segment is readable on its own (the analyzer's workers read
  byte ranges: a chunk before the range is one positioned read away), and deleting or copying a
  whole segment takes its chunks along: retention needs no garbage collection. The price is
  that a long conversation's prefix is written once more in each new segment (64 MiB or 1 h).
- The id is checked on read, so a damaged chunk makes its record reported corrupt, never wrong.
  SHA-256 (truncated to 128 bits) rather than BLAKE2b: hashing new chunks is a large part of
  the writer's cost, and OpenSSL's SHA-256 uses the CPU's SHA instructions (1.5x faster here);
  a cryptographic hash, so a client cannot forge a chunk that another client's body would then
  be rebuilt from.
- zlib level 1 (stdlib, releases the GIL) is used when the compressed, base64-armoured data is
  at least a fifth smaller than the text, otherwise the chunk stays readable text (base64 if not
  UTF-8). Measured on the storage benchmark: 20% fewer bytes than no compression for 4% more
  writer time; level 6 saved 1% more for 20% more time.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import re
import zlib
from pathlib import Path
from typing import Any

import orjson

from toolproxy.record.model import Record, encode_record

BODY_FIELDS = ("request_body", "response_body", "client_body")
# Bodies up to this many characters stay inline: below it a chunk line and its references save
# little, and the record is serialised on the event loop as before.
INLINE_BODY_CHARS = 4096
MIN_CHUNK = 256
MAX_CHUNK = 64 * 1024
# A segment's index of written chunks is dropped when it reaches this many entries (chunks are
# then written again): the writer's memory stays bounded whatever one segment holds.
MAX_INDEX = 1 << 17
CHUNK_PREFIX = b'{"kind":"chunk",'
_CUT = re.compile(rb"\}(?=\s*(?:,\s*\{|\]))")


class ChunkError(Exception):
    """A chunk reference that cannot be resolved (torn, corrupt or hostile segment data)."""


def cut_points(data: bytes, start: int = 0) -> list[int]:
    """End offsets of the chunks of `data` (the last is len(data)); see the module docstring.

    From `start` on, when `start` is known to be one of the cut points."""
    cuts = []
    last = start
    n = len(data)
    while True:
        m = _CUT.search(data, last + MIN_CHUNK)
        cut = m.start() + 1 if m is not None else n
        while cut - last > MAX_CHUNK:
            last += MAX_CHUNK
            cuts.append(last)
        if m is None:
            break
        cuts.append(cut)
        last = cut
    if last < n:
        cuts.append(n)
    return cuts


def is_chunk_line(line: bytes) -> bool:
    return line.startswith(CHUNK_PREFIX)


def _wire_bytes(text: str, encoding: str | None) -> bytes | None:
    """The body's bytes, or None when (text, encoding) would not round-trip exactly (left inline)."""
    try:
        if encoding == "base64":
            raw = base64.b64decode(text, validate=True)
            return raw if base64.b64encode(raw).decode("ascii") == text else None
        return text.encode("utf-8")
    except (ValueError, UnicodeError):
        return None


def _text(raw: bytes, encoding: str | None) -> str:
    if encoding == "base64":
        return base64.b64encode(raw).decode("ascii")
    return raw.decode("utf-8")


def _chunk_line(key: bytes, piece: bytes, compress: bool) -> bytes:
    enc, data = None, None
    if compress:
        packed = base64.b64encode(zlib.compress(piece, 1))
        if len(packed) * 5 <= len(piece) * 4:
            enc, data = "zlib", packed.decode("ascii")
    if enc is None:
        try:
            enc, data = "utf8", piece.decode("utf-8")
        except UnicodeDecodeError:
            enc, data = "base64", base64.b64encode(piece).decode("ascii")
    return orjson.dumps({"kind": "chunk", "id": key.hex(), "enc": enc, "data": data}, option=orjson.OPT_APPEND_NEWLINE)


class _RecentBodies:
    """Bodies packed lately into the current segment, grouped by their first INLINE_BODY_CHARS
    bytes, with their cut points and chunk offsets.

    Cutting and hashing every chunk of every body was most of the writer's cost, and most of a
    body is the history packed a turn ago. If a body starts with the first k chunks of an earlier
    one (one memcmp per step of a binary search), it has the same first k cut points and chunk
    lines, provided the last of those cuts is a cut in the new body too: every cut decision
    before it reads only bytes before it (a `}` followed by blanks, then `,` blanks `{`, or `]`).
    Several bodies per head, since concurrent episodes often share a long system prompt.
    """

    PER_HEAD = 8
    MAX_BYTES = 32 << 20

    def __init__(self) -> None:
        self._heads: collections.OrderedDict[int, list[tuple[bytes, list[int], list[int]]]] = collections.OrderedDict()
        self._bytes = 0

    def longest_prefix(self, head: int, raw: bytes) -> tuple[tuple[bytes, list[int], list[int]] | None, int]:
        """(earlier body, k): `raw` is cut like that body up to its k-th cut point (k = 0: none)."""
        best, best_k = None, 0
        for body in reversed(self._heads.get(head, ())):
            earlier, cuts = memoryview(body[0]), body[1]
            lo, hi = 0, len(cuts)  # raw starts with the first lo chunks; not with the first hi+1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if raw.startswith(earlier[: cuts[mid - 1]]):
                    lo = mid
                else:
                    hi = mid - 1
            # Only a cut the search found (not the body's end, not a MAX_CHUNK split) qualifies.
            while lo > best_k and not (_CUT.match(body[0], cuts[lo - 1] - 1) and _CUT.match(raw, cuts[lo - 1] - 1)):
                lo -= 1
            if lo > best_k:
                best, best_k = body, lo
        return best, best_k

    def add(self, head: int, body: tuple[bytes, list[int], list[int]], continues: tuple | None) -> None:
        """Remember `body`, in place of the earlier body it `continues` (the next turn of it)."""
        bodies = self._heads.setdefault(head, [])
        self._heads.move_to_end(head)
        for i, other in enumerate(bodies):
            if other is continues:
                self._bytes -= len(bodies.pop(i)[0])
                break
        bodies.append(body)
        self._bytes += len(body[0])
        if len(bodies) > self.PER_HEAD:
            self._bytes -= len(bodies.pop(0)[0])
        while self._bytes > self.MAX_BYTES:
            oldest_head, oldest = next(iter(self._heads.items()))
            self._bytes -= len(oldest.pop(0)[0])
            if not oldest:
                del self._heads[oldest_head]


class ChunkPacker:
    """Writer side: turns a batch of queued records into the bytes to append to a segment.

    Keeps the index of chunks already in the segment it last packed for. It notices a new
    segment (another file object) or a write that did not land (the file is not where the last
    pack left it) by itself and starts a fresh index, so a record only ever points at chunk lines
    that were handed to the same file before it.
    """

    def __init__(self, *, compress: bool = True) -> None:
        self.compress = compress
        self._file: Any = None
        self._expected = -1
        self._index: dict[bytes, int] = {}
        self._recent = _RecentBodies()

    def pack(self, batch: list[tuple[Record, bytes | None, Any]], file: Any) -> bytes:
        """Segment bytes for `batch` (records with a line already serialised are copied as is)."""
        base = file.tell()
        if file is not self._file or base != self._expected:
            self._file, self._index, self._recent = file, {}, _RecentBodies()
        self._expected = -1  # until packed in full: if a record cannot be serialised, start afresh
        out = bytearray()
        for rec, line, _ in batch:
            if line is None:
                line = self._record_line(rec, out, base)
            out += line
        self._expected = base + len(out)
        return bytes(out)

    def _record_line(self, rec: Record, out: bytearray, base: int) -> bytes:
        fields = None
        for name in BODY_FIELDS:
            refs = self._refs(getattr(rec, name), getattr(rec, name + "_encoding"), out, base)
            if refs is not None:
                fields = fields or _all_fields(rec)
                fields[name], fields[name + "_chunks"] = None, refs
        up = rec.upstream_request
        if isinstance(up, dict):
            refs = self._refs(up.get("body"), up.get("body_encoding"), out, base)
            if refs is not None:
                fields = fields or _all_fields(rec)
                fields["upstream_request"] = {**up, "body": None, "body_chunks": refs}
        return encode_record(rec, fields)

    def _refs(self, text: Any, encoding: Any, out: bytearray, base: int) -> list[int] | None:
        if not isinstance(text, str) or len(text) <= INLINE_BODY_CHARS:
            return None
        raw = _wire_bytes(text, encoding)
        if raw is None:
            return None
        if len(self._index) >= MAX_INDEX:
            self._index, self._recent = {}, _RecentBodies()
        index = self._index
        head = hash(raw[:INLINE_BODY_CHARS])
        earlier, k = self._recent.longest_prefix(head, raw)
        if earlier is None:
            cuts, refs, start = [], [], 0
        else:
            cuts, refs = earlier[1][:k], earlier[2][:k]
            start = cuts[-1]
        new_cuts = cut_points(raw, start)
        cuts += new_cuts
        for end in new_cuts:
            piece = raw[start:end]
            start = end
            key = hashlib.sha256(piece).digest()[:16]
            at = index.get(key)
            if at is None:
                at = index[key] = base + len(out)
                out += _chunk_line(key, piece, self.compress)
            refs.append(at)
        self._recent.add(head, (raw, cuts, refs), earlier if earlier is not None and 2 * k >= len(earlier[1]) else None)
        return refs


def decode_chunk(line: bytes, offset: int) -> bytes:
    """The bytes a chunk line holds, checked against its id."""
    try:
        obj = orjson.loads(line)
        enc, data, key = obj["enc"], obj["data"], obj["id"]
        if enc == "zlib":
            piece = zlib.decompress(base64.b64decode(data, validate=True))
        elif enc == "base64":
            piece = base64.b64decode(data, validate=True)
        elif enc == "utf8":
            piece = data.encode("utf-8")
        else:
            raise ChunkError(f"chunk at offset {offset} has unknown encoding {enc!r}")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError, zlib.error) as exc:
        raise ChunkError(f"chunk at offset {offset} is unreadable: {type(exc).__name__}: {exc}") from None
    if hashlib.sha256(piece).digest()[:16].hex() != key:
        raise ChunkError(f"chunk at offset {offset} does not match its id (damaged)")
    return piece


class ChunkSource:
    """Reader side: chunk bytes by the offset of their line in one segment.

    Served from `data` (bytes of the segment starting at `data_start`, e.g. the range an analyzer
    worker read), from lines `note`d by a sequential reader, or else by a positioned read of the
    file. Decoded chunks are cached up to `cache_bytes`, since every later turn of an episode
    refers to the same early ones.
    """

    def __init__(self, path: str | Path, data: bytes = b"", data_start: int = 0, cache_bytes: int = 64 << 20) -> None:
        self.path = Path(path)
        self._data, self._data_start = data, data_start
        self._lines: dict[int, bytes] = {}
        self._cache: dict[int, bytes] = {}
        self._held = 0
        self._budget = cache_bytes
        self._file = None

    def __enter__(self) -> ChunkSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def note(self, offset: int, line: bytes) -> None:
        """A chunk line a sequential reader just passed (kept undecoded until a record needs it)."""
        self._hold(len(line))
        self._lines[offset] = line

    def _hold(self, n: int) -> None:
        self._held += n
        if self._held > self._budget:
            self._lines.clear()
            self._cache.clear()
            self._held = n

    def get(self, offset: Any) -> bytes:
        if type(offset) is not int or offset < 0:
            raise ChunkError(f"bad chunk reference {offset!r}")
        piece = self._cache.get(offset)
        if piece is None:
            line = self.line_at(offset)
            if not is_chunk_line(line):
                raise ChunkError(f"offset {offset} is not the start of a chunk line")
            piece = decode_chunk(line, offset)
            self._hold(len(piece))
            self._cache[offset] = piece
        return piece

    def line_at(self, offset: int) -> bytes:
        """The segment's line that starts at `offset`, without its newline."""
        line = self._lines.pop(offset, None)
        if line is not None:
            return line
        rel = offset - self._data_start
        if 0 <= rel < len(self._data):
            end = self._data.find(b"\n", rel)
            if end >= 0:
                return self._data[rel:end]
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except OSError as exc:
                raise ChunkError(f"cannot read chunks of {self.path.name}: {exc}") from None
        f = self._file
        f.seek(offset)
        parts = []
        step = 4096
        while True:
            buf = f.read(step)
            if not buf:
                raise ChunkError(f"chunk at offset {offset} is missing (past the end of the segment or torn)")
            end = buf.find(b"\n")
            if end >= 0:
                parts.append(buf[:end])
                break
            parts.append(buf)
            step = min(step * 4, 4 << 20)
        return b"".join(parts)

    def _body(self, refs: Any, encoding: Any) -> str:
        if not isinstance(refs, list):
            raise ChunkError("chunk references are not a list")
        try:
            return _text(b"".join([self.get(at) for at in refs]), encoding)
        except UnicodeDecodeError as exc:
            raise ChunkError(f"chunks do not make UTF-8 text: {exc}") from None

    def resolve(self, rec: dict[str, Any]) -> str | None:
        """Put the bodies of a parsed record back in place; the reason if that is impossible."""
        try:
            for name in BODY_FIELDS:
                refs = rec.pop(name + "_chunks", None)
                if refs is not None:
                    rec[name] = self._body(refs, rec.get(name + "_encoding"))
            up = rec.get("upstream_request")
            if isinstance(up, dict) and "body_chunks" in up:
                up["body"] = self._body(up.pop("body_chunks"), up.get("body_encoding"))
        except ChunkError as exc:
            return f"corrupt: {exc}"
        return None


def _all_fields(rec: Record) -> dict:
    """Every field of the record, its kind's own included (an McpRecord's `mcp`)."""
    return {f: getattr(rec, f) for f in type(rec).__dataclass_fields__}
