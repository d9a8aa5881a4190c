"""Whether a database lags its data directory: segments holding complete lines it has not ingested.

`report`, `compare`, `show` and `export` read the database, while the proxy (and `doctor`,
`conformance`, `run`) keep appending to segments: without this check a report leaves new runs out
without a word. It compares each segment with the offset `analyze` reached in it (ingest_state),
the same bookkeeping `analyze` resumes from, so the answer is "analyze would read something", not
a guess from file times. A segment the proxy is still writing ends in a torn line; bytes after
the last newline are not counted, or every report would re-analyze a live segment for nothing.
"""

from __future__ import annotations

from pathlib import Path

from toolproxy.record.segments import list_segments

_PIECE = 1 << 16


def unanalyzed_segments(data_dir: Path, db_path: Path) -> list[str]:
    """Names of the segments in `data_dir` with complete lines past what `db_path` ingested.

    Every segment with a complete line when there is no database yet; none when the database
    cannot be read (locked by a writer, an older schema): the command opening it says why.
    """
    segments = list_segments(data_dir)
    if not segments:
        return []
    offsets = _ingested_offsets(db_path)
    if offsets is None:
        return []
    stale = []
    for path in segments:
        if not path.is_file():  # a FIFO would block the read; analyze skips it with a note
            continue
        try:
            if _has_line_after(path, offsets.get(path.name, 0)):
                stale.append(path.name)
        except OSError:  # unreadable: analyze skips it with a note too, so it never gets fresher
            continue
    return stale


def _ingested_offsets(db_path: Path) -> dict[str, int] | None:
    from toolproxy.analysis.store.connection import StoreError, connect

    if not db_path.exists():
        return {}
    try:
        con = connect(db_path, read_only=True, memory_limit=None)
    except StoreError:
        return None
    try:
        return dict(con.execute("SELECT segment, byte_offset FROM ingest_state").fetchall())
    finally:
        con.close()


def _has_line_after(path: Path, offset: int) -> bool:
    """A newline after `offset` (the file shrank below it: analyze re-reads it from the start)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(offset if offset <= size else 0)
        while piece := f.read(_PIECE):
            if b"\n" in piece:
                return True
    return False
