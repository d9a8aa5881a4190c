"""How much memory a command's DuckDB work may take (`--memory-limit`), read the way a user writes it.

DuckDB's own default is 80% of RAM, which on a host shared with the proxy (or several analyses)
takes memory others need; past the limit it spills to a temporary directory beside the database
instead of failing. The value is parsed here rather than handed to DuckDB as text, so a typo is a
usage error naming the flag, a quote cannot reach SQL, and the export can size its batches from
the same number.
"""

from __future__ import annotations

import os
import re

DEFAULT_MEMORY_LIMIT = "1GB"
# Below this DuckDB cannot hold the working set of one statement over the analyzer's tables.
MIN_MEMORY_LIMIT = 64 * 1000 * 1000

_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*|%)\s*", re.IGNORECASE)


class MemoryLimitError(ValueError):
    """A --memory-limit that is not a size; the message says what is accepted."""


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_memory_limit(text: str) -> int:
    """Bytes for '1GB', '512MiB', '1.5 GB' (DuckDB's units: KB/MB/GB/TB are powers of 1000,
    KiB/MiB/GiB/TiB of 1024) or '25%' of this machine's physical memory."""
    m = _SIZE.fullmatch(text or "")
    unit = m.group(2).lower() if m else ""
    if m is None or (unit != "%" and unit not in _UNITS):
        raise MemoryLimitError(f"{text!r} is not a memory size: give e.g. 1GB, 512MB, 2GiB or 25% (of RAM)")
    number = float(m.group(1))
    if unit == "%":
        if not 0 < number <= 100:
            raise MemoryLimitError(f"{text!r}: a share of RAM is between 0% and 100%")
        size = int(physical_memory() * number / 100)
    else:
        size = int(number * _UNITS[unit])
    if size < MIN_MEMORY_LIMIT:
        raise MemoryLimitError(f"{text!r} is below the {MIN_MEMORY_LIMIT // 1000**2}MB DuckDB needs to work")
    return size


def memory_limit_of(con) -> int:
    """The limit the connection runs under, in bytes (DuckDB reports it as e.g. '953.6 MiB')."""
    text = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    m = _SIZE.fullmatch(text)
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
