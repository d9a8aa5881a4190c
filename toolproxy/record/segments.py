"""Reading segments back, safely, while the proxy may still be appending to them.

Only complete lines (ending in a newline) are records. A trailing partial line is either being
written right now or was torn by a crash; either way it is reported and skipped, and the reader's
resume offset stops before it, so a later read picks it up if it completes. A complete line that
does not parse is corrupt: reported with its offset and skipped, never fatal.

Chunk lines (record version 2, toolproxy/record/chunks.py) are storage, not records: readers skip
them and get every record with its bodies put back, byte for byte. A record whose chunks cannot
be read is reported corrupt like an unparsable line.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from toolproxy.record.chunks import BODY_FIELDS, ChunkError, ChunkSource, is_chunk_line

# Where the writer (record/writer.py) puts its segments; named here, with the reader, so that what
# only reads records never imports the writer.
SEGMENT_DIR = "segments"
SEGMENT_SUFFIX = ".jsonl"
# A segment's name is `<UTC time>-<pid>-<sequence>-<replica>[.refused].jsonl`; this finds the replica
# (group 1; no match in names written before replicas were named). Python's and DuckDB's syntax alike.
SEGMENT_REPLICA = r"^[0-9]{8}T[0-9]{6}-[0-9]+-[0-9]+-(.+?)(?:\.refused)?\.jsonl$"
# The stream of refused requests' records (proxy/refusals.py) has segments of its own, named like
# the others with this before the suffix: a disk budget can then tell them apart and never prune
# an exchange's record to make room for them.
REFUSALS_STREAM = ".refused"


@dataclass(frozen=True, slots=True)
class SegmentLine:
    path: Path
    offset: int
    end: int
    record: dict[str, Any] | None
    error: str | None = None


def list_segments(data_dir: str | Path) -> list[Path]:
    """Segments in the order they were written (names start with a UTC timestamp)."""
    seg_dir = Path(data_dir) / SEGMENT_DIR
    if not seg_dir.is_dir():
        return []
    return sorted(p for p in seg_dir.iterdir() if p.name.endswith(SEGMENT_SUFFIX))


def read_lines(
    path: str | Path, start: int = 0, chunk_size: int = 4 * 1024 * 1024
) -> Iterator[tuple[int, int, bytes | None]]:
    """(offset, end, line) for every non-blank complete line from byte offset `start` on, unparsed.

    A torn tail comes last as (offset, end, None). Separate from read_segment so a reader that
    parses elsewhere (the analyzer's worker processes) does not pay for parsing twice.
    """
    with open(path, "rb") as f:
        f.seek(start)
        offset = start
        buf = b""
        while True:
            chunk = f.read(chunk_size)
            if not chunk:
                break
            buf += chunk
            lines = buf.split(b"\n")
            buf = lines.pop()
            for line in lines:
                end = offset + len(line) + 1
                if line.strip():
                    yield offset, end, line
                offset = end
        if buf:
            yield offset, offset + len(buf), None


_REQUEST_SIZE = re.compile(rb'"request_body_size":(\d+)')
# Every chunked field ends so (request_body_chunks, ..., upstream_request.body_chunks); the longer
# needle is also found faster than `_chunks":[`.
_CHUNK_REFS = b'body_chunks":['


def expanded_size(line: bytes) -> int:
    """About how many bytes a record line stands for once its bodies are put back.

    A line of a few hundred bytes can name megabytes of chunks: work batched by bytes on disk
    (analyze) must count these to stay bounded in memory. The request body's recorded size
    stands for each chunked body; the request is what a resent history makes large.
    """
    n = line.count(_CHUNK_REFS)
    if not n:
        return len(line)
    m = _REQUEST_SIZE.search(line)
    return len(line) + n * (int(m.group(1)) if m else 1 << 20)


def batch_end(f, start: int, end: int, budget: int) -> int:
    """Where a batch of the whole lines in [start, end) of open segment `f` should end so that,
    bodies put back, it stands for about `budget` bytes (at least one line).

    Reads at most `budget` bytes: a line running past them is a body stored whole, whose size on
    disk is already what it stands for.
    """
    f.seek(start)
    data = f.read(min(end - start, budget))
    if data.find(_CHUNK_REFS) < 0:
        return end
    total = 0
    pos = 0
    while (nl := data.find(b"\n", pos)) >= 0:
        # Lines without chunk references (most bytes, when bodies are stored whole) are not copied.
        total += expanded_size(data[pos:nl]) if data.find(_CHUNK_REFS, pos, nl) >= 0 else nl - pos
        pos = nl + 1
        if total >= budget:
            return start + pos
    return end


def parse_line(line: bytes, chunks: ChunkSource | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) or (None, why the line is corrupt). With `chunks` (the line's segment), bodies
    stored as chunk references are put back; without, such a record keeps its references."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return None, f"corrupt: {exc}"
    if not isinstance(rec, dict):
        return None, "corrupt: not a JSON object"
    if chunks is not None:
        error = chunks.resolve(rec)
        if error is not None:
            return None, error
    return rec, None


def read_segment(path: str | Path, start: int = 0, chunk_size: int = 4 * 1024 * 1024) -> Iterator[SegmentLine]:
    """Yield every complete record line from byte offset `start` on (chunk lines are not records).

    A torn tail is yielded as a SegmentLine with record None and error "torn_tail"; its `offset`
    is where a resumed read must start again.
    """
    path = Path(path)
    with ChunkSource(path) as chunks:
        for offset, end, line in read_lines(path, start, chunk_size):
            if line is None:
                yield SegmentLine(path, offset, end, None, "torn_tail")
            elif is_chunk_line(line):
                chunks.note(offset, line)
            else:
                rec, error = parse_line(line, chunks)
                yield SegmentLine(path, offset, end, rec, error)


# A record's bodies as the proxy wrote them: each one's text and its encoding (utf8 or base64).
BODIES_AS_RECORDED = tuple(f for name in BODY_FIELDS for f in (name, f"{name}_encoding"))


class RecordReader:
    """Records by segment file name and byte offset, the way the analyzer's database refers to
    them, with their bodies put back.

    The database keeps no copy of the bodies: this is how they are read back (show, replay,
    export, re-classification, SQL's `bodies()`). Open segments and their chunk caches are kept
    for the next lookup, since callers go through many records of one segment in offset order.
    One lookup at a time: DuckDB calls `bodies()` from each of its threads, and two reads of one
    segment sharing its file's position interleaved their seeks (exporting 1M exchanges, a record
    read back corrupt); the open segments and their caches are shared as well.
    """

    _OPEN = 8

    def __init__(self, data_dir: str | Path) -> None:
        self.seg_dir = Path(data_dir) / SEGMENT_DIR
        self._sources: dict[str, ChunkSource] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for source in self._sources.values():
                source.close()
            self._sources.clear()

    def record(self, segment: str, offset: int) -> dict[str, Any]:
        """The record at `offset` of `segment`; RecordError saying why when it cannot be read
        (the segment is not there: pruned, moved, another data directory; no record there)."""
        with self._lock:
            return self._record(segment, offset)

    def _record(self, segment: str, offset: int) -> dict[str, Any]:
        source = self._sources.get(segment)
        if source is None:
            path = self.seg_dir / segment
            if "/" in segment or not path.is_file():
                raise RecordError(f"segment {segment} is not in {self.seg_dir}")
            if len(self._sources) >= self._OPEN:
                self._sources.pop(next(iter(self._sources))).close()
            source = self._sources[segment] = ChunkSource(path)
        try:
            rec, error = parse_line(source.line_at(offset), source)
        except ChunkError as exc:
            rec, error = None, str(exc)
        if rec is None:
            raise RecordError(f"{segment} @{offset}: {error}")
        return rec


class RecordError(Exception):
    pass


def read_records(data_dir: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Every complete record under data_dir in write order (only those of `kind` if given: records
    without a kind are exchanges); torn tails and corrupt lines skipped."""
    return [
        line.record
        for seg in list_segments(data_dir)
        for line in read_segment(seg)
        if line.record is not None and (kind is None or line.record.get("kind", "exchange") == kind)
    ]
