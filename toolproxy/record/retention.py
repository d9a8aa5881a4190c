"""Deleting whole segments, safely, while a proxy may be writing the newest ones.

A segment is the unit of deletion: request bodies are deduplicated only within a segment
(record/chunks.py), so a closed segment stands alone and removing it leaves every other one
readable. Three rules keep a prune from losing or corrupting anything:

- A live writer holds an exclusive advisory lock (flock) on the segment it is appending to, for as
  long as it is open; prune takes the same lock without waiting and skips a segment it cannot get.
  With several writers (workers) each locks its own stream's open segment.
- Pruning is logged before bytes go: the segment is renamed out of the readers' sight
  (`.pruned`), its name appended (and fsync'ed) to `pruned.jsonl` in the data directory, then
  unlinked. The analyzer reads that ledger to drop the rows derived from those segments, so the
  database never points at deleted bytes, whichever process pruned and whenever analyze runs next.
  A crash between the steps is finished by the next prune.
- Age is the segment's last write (its mtime): every record in it is at least that old.

Refused requests' records have segments of their own (`...<replica>.refused.jsonl`,
proxy/refusals.py). `refusals` picks which a call considers: None every segment, False only the
exchanges' segments (a disk budget's), True only the refusals' (their own small cap).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

from toolproxy.record.segments import REFUSALS_STREAM, SEGMENT_DIR, SEGMENT_SUFFIX

LEDGER = "pruned.jsonl"
PRUNING_SUFFIX = ".pruned"
REFUSALS_SUFFIX = REFUSALS_STREAM + SEGMENT_SUFFIX
# One prune at a time in a process: the writer threads (before a new segment) and the
# housekeeping thread all prune, and two of them finishing one interrupted prune would clash.
_PRUNING = threading.Lock()


def _lock(f: IO[bytes]) -> bool:
    """Take the lock a live writer holds on its open segment; False when a writer holds it."""
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Segment:
    path: Path
    size: int
    mtime: float


@dataclass
class PruneResult:
    pruned: list[Segment] = field(default_factory=list)
    live: list[str] = field(default_factory=list)  # skipped: a writer holds them open
    kept_mixed: list[str] = field(default_factory=list)  # skipped: hold records of other runs

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.pruned)


def is_refusals(name: str) -> bool:
    return name.endswith(REFUSALS_SUFFIX)


def closed_segments(data_dir: str | Path, refusals: bool | None = None) -> list[Segment]:
    """Segments oldest first (by last write), with their size; files that vanish meanwhile are left out."""
    seg_dir = Path(data_dir) / SEGMENT_DIR
    if not seg_dir.is_dir():
        return []
    out = []
    for p in seg_dir.iterdir():
        if not p.name.endswith(SEGMENT_SUFFIX) or (refusals is not None and is_refusals(p.name) != refusals):
            continue
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        out.append(Segment(p, st.st_size, st.st_mtime))
    return sorted(out, key=lambda s: (s.mtime, s.path.name))


def data_dir_bytes(data_dir: str | Path, refusals: bool | None = None) -> int:
    """Bytes the segments take (what a disk budget governs; the DuckDB file is the analyzer's)."""
    return sum(s.size for s in closed_segments(data_dir, refusals))


def runs_in(path: Path) -> set[str | None]:
    """Every run tag in a segment's records (None for records without one). Reads the whole file."""
    from toolproxy.record.chunks import is_chunk_line
    from toolproxy.record.segments import parse_line, read_lines

    runs: set[str | None] = set()
    for _, _, line in read_lines(path):
        if line is None or is_chunk_line(line):
            continue
        rec, _ = parse_line(line)
        if rec is not None:
            run = rec.get("run")
            runs.add(run if isinstance(run, str) else None)
    return runs


def read_ledger(data_dir: str | Path) -> set[str]:
    """Names of every segment ever pruned from this data directory."""
    path = Path(data_dir) / LEDGER
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set()
    names = set()
    for line in data.splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a torn last line from a crash: its segment is still `.pruned` and is redone
        if isinstance(entry, dict) and isinstance(entry.get("segment"), str):
            names.add(entry["segment"])
    return names


def _log(data_dir: Path, seg: Segment, reason: str) -> None:
    line = orjson.dumps(
        {
            "segment": seg.path.name,
            "bytes": seg.size,
            "last_write": seg.mtime,
            "pruned_at": time.time(),
            "reason": reason,
        },
        option=orjson.OPT_APPEND_NEWLINE,
    )
    fd = os.open(data_dir / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish_interrupted(data_dir: Path, reason: str) -> list[Segment]:
    """Segments a crashed prune renamed but did not log or delete."""
    done = []
    seg_dir = data_dir / SEGMENT_DIR
    logged = read_ledger(data_dir)
    for p in sorted(seg_dir.glob(f"*{SEGMENT_SUFFIX}{PRUNING_SUFFIX}")):
        name = p.name[: -len(PRUNING_SUFFIX)]
        st = p.stat()
        seg = Segment(seg_dir / name, st.st_size, st.st_mtime)
        if name not in logged:
            _log(data_dir, seg, reason)
        p.unlink(missing_ok=True)
        done.append(seg)
    return done


def _remove(data_dir: Path, seg: Segment, reason: str) -> bool:
    """Lock, hide, log, unlink one segment. False when a live writer holds it."""
    try:
        f = open(seg.path, "rb")
    except FileNotFoundError:
        return False
    with f:
        if not _lock(f):
            return False
        hidden = seg.path.with_name(seg.path.name + PRUNING_SUFFIX)
        os.rename(seg.path, hidden)
        _log(data_dir, seg, reason)
        hidden.unlink()
    return True


def prune(
    data_dir: str | Path,
    *,
    older_than: float | None = None,
    max_bytes: int | None = None,
    run: str | None = None,
    dry_run: bool = False,
    now: float | None = None,
    progress=None,
    refusals: bool | None = None,
) -> PruneResult:
    """Delete closed segments last written more than `older_than` seconds ago, then (with
    `max_bytes`) the oldest closed ones until the segments fit in `max_bytes`.

    With `run`, only segments whose every record carries that run tag go: a segment shared with
    other runs is kept whole (listed in kept_mixed) and goes when it ages out for everyone.
    `progress` (toolproxy.term.progress.Progress) is told the bytes of the segments considered and
    advanced by each: with `run`, each is read through. `refusals`: which segments count (module doc).
    """
    with _PRUNING:
        return _prune(Path(data_dir), older_than, max_bytes, run, dry_run, now, progress, refusals)


def _prune(
    data_dir: Path,
    older_than: float | None,
    max_bytes: int | None,
    run: str | None,
    dry_run: bool,
    now: float | None,
    progress,
    refusals: bool | None,
) -> PruneResult:
    now = time.time() if now is None else now
    result = PruneResult()
    if not dry_run and (data_dir / SEGMENT_DIR).is_dir():
        result.pruned.extend(_finish_interrupted(data_dir, "finishing an interrupted prune"))
    segments = closed_segments(data_dir, refusals)
    total = sum(s.size for s in segments)
    if progress is not None:
        progress.total = total
    for seg in segments:
        if progress is not None:
            progress.advance(seg.size)
        if seg.size == 0:
            continue  # just opened by a writer that has not locked it yet, or nothing to free
        too_old = older_than is not None and now - seg.mtime > older_than
        over = max_bytes is not None and total > max_bytes
        if not (too_old or over):
            if older_than is not None and max_bytes is None:
                break  # oldest first: the rest are younger
            continue
        if run is not None:
            held = runs_in(seg.path)
            if held != {run}:
                if run in held:
                    result.kept_mixed.append(seg.path.name)
                continue
        reason = f"older than {older_than:g}s" if too_old else f"over the disk budget of {max_bytes} bytes"
        if dry_run:
            if _is_live(seg.path):
                result.live.append(seg.path.name)
                continue
        elif not _remove(data_dir, seg, reason):
            result.live.append(seg.path.name)
            continue
        result.pruned.append(seg)
        total -= seg.size
    return result


def _is_live(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return not _lock(f)
    except FileNotFoundError:
        return False
