"""Sizes and durations as operators write them on a command line: one parser each, for every flag.

Size units are binary whichever way they are spelled (k, KB, KiB all mean 1024 bytes): the flags
bound memory and disk, where a kibibyte is what the system counts, and nobody wants `64MB` and
`64MiB` to give different limits.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_BYTES = {None: 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """Bytes in '4096', '512k', '64MiB', '500MB', '1.5g', '100b'. ValueError with a usable message otherwise."""
    m = _SIZE.match(text or "")
    if not m:
        raise ValueError(f"{text!r} is not a size; write a number and a unit: 4096, 512k, 64MiB, 20GiB")
    unit = m.group(2)
    return int(float(m.group(1)) * _BYTES[unit.lower() if unit else None])


def parse_duration(text: str) -> float:
    """Seconds in '90s', '30m', '12h', '7d', '2w'. ValueError with a usable message otherwise."""
    m = _DURATION.match(text or "")
    if not m:
        raise ValueError(f"{text!r} is not a duration; write a number and a unit: 90s, 30m, 12h, 7d, 2w")
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]
