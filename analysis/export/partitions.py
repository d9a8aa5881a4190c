"""Directory names for hive-style partitions (`date=2026-11-30/run=NAME/`), safe for any run name.

A run name is whatever a harness put in a header or URL, so it may hold slashes, `..`, control
characters, `%`, `=` or thousands of characters. The directory name percent-encodes every byte
outside letters, digits, `-`, `_` and `~` (so `.` too: no name can become `.` or `..`), which
DuckDB, Spark and pyarrow decode back to the name when they read the partition. A name whose
encoding would pass the 255-byte limit most filesystems and object stores put on one path part is
shortened and made unique with a hash of the whole name; its exact spelling stays in the files'
own `run` column.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

# Encoded run names longer than this are shortened (filesystems allow 255 bytes per path part,
# and `run=` plus a hash suffix must fit).
MAX_ENCODED = 200
_KEEP = 160
# Hive's spelling of NULL: a run literally named so must not read back as NULL.
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _quote(text: str) -> str:
    return quote(text, safe="-_~", errors="surrogatepass").replace(".", "%2E")


def encode_value(name: str) -> str:
    """The name as one safe path part, which decodes back to the name (up to MAX_ENCODED bytes)."""
    encoded = _quote(name)
    if name == _HIVE_NULL:
        encoded = encoded.replace("_", "%5F")
    if len(encoded) <= MAX_ENCODED:
        return encoded
    kept, size = [], 0
    for char in name:  # cut between characters, so the shortened part still decodes as UTF-8
        part = _quote(char)
        if size + len(part) > _KEEP:
            break
        kept.append(part)
        size += len(part)
    return f"{''.join(kept)}~{hashlib.blake2b(name.encode('utf-8', 'surrogatepass'), digest_size=8).hexdigest()}"


def partition_path(date: str | None, run: str) -> str:
    """`date=YYYY-MM-DD/run=ENCODED`, or `run=ENCODED` for tables with one row per run."""
    part = f"run={encode_value(run)}"
    return f"date={date}/{part}" if date is not None else part
