"""What a record line must hold to be read at all: one verdict for every reader of segments.

`analyze` stores a record's scalar fields as they are, in typed columns; `playback` sends them back
on the wire. A line the proxy did not write (edited by hand, damaged, from another program) must
be told apart before either uses it, and the same way for both, so that a line analyze sets aside
is never played back and a line playback serves is one analyze counts. A line is

- `corrupt`: not a JSON object, its body chunks cannot be read, or it has no id;
- `unknown_kind`: a kind this toolproxy does not know;
- `bad_type`: a field whose value does not have the field's type (a status that is not a 32-bit
  integer, a body that is not text, a time that no timestamp holds).

Such a line is set aside: counted, named by its segment and offset with the reason (`Issue`), and
never used. The fields kept as JSON whatever their shape (headers, tags, `extra`,
`upstream_request`) are not judged here: analyze stores them as they are, and a reader that needs
their shape (playback sends the headers) checks what it uses.

The types are those of the columns analyze stores the fields in, named as DuckDB names them.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from toolproxy.record.chunks import BODY_FIELDS
from toolproxy.record.model import MCP as MCP
from toolproxy.record.sampling import SAMPLED_OUT
from toolproxy.record.segments import list_segments, read_segment
from toolproxy.term.jsontype import json_type

CORRUPT, BAD_TYPE, UNKNOWN_KIND = "corrupt", "bad_type", "unknown_kind"
SET_ASIDE = (CORRUPT, BAD_TYPE, UNKNOWN_KIND)
EXCHANGE, FINGERPRINT = "exchange", "fingerprint"
KINDS = frozenset({EXCHANGE, SAMPLED_OUT, FINGERPRINT, MCP})

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
# Epoch seconds DuckDB can hold as a TIMESTAMP (microseconds in an int64, about +-292,000 years).
EPOCH_SECONDS = 9.2e12


def _is_int(value: Any, bounds: tuple[int, int]) -> bool:
    return type(value) is int and bounds[0] <= value <= bounds[1]


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


# Per type: whether a value (never None: a field left out or null always fits) has it, and its name in words.
FITS = {
    "VARCHAR": lambda v: type(v) is str,
    "JSON": lambda v: type(v) is str,
    "INTEGER": lambda v: _is_int(v, INT32),
    "BIGINT": lambda v: _is_int(v, INT64),
    "DOUBLE": _is_number,
    "TIMESTAMP": lambda v: _is_number(v) and -EPOCH_SECONDS < v < EPOCH_SECONDS,
    "BOOLEAN": lambda v: type(v) is bool,
    "VARCHAR[]": lambda v: type(v) is list and all(type(x) is str for x in v),
}
WORDS = {
    "VARCHAR": "a string",
    "JSON": "JSON text",
    "INTEGER": "a 32-bit integer",
    "BIGINT": "a 64-bit integer",
    "DOUBLE": "a number",
    "TIMESTAMP": "a time in seconds since 1970",
    "BOOLEAN": "true or false",
    "VARCHAR[]": "a list of strings",
}

# The bodies as the proxy wrote them: each one's text and its encoding (utf8 or base64).
BODIES = {f: "VARCHAR" for name in BODY_FIELDS for f in (name, f"{name}_encoding")}
# The fields analyze stores as they are in a typed column (its exchanges table has the same types).
STORED = {
    "id": "VARCHAR",
    "kind": "VARCHAR",
    "started_at": "TIMESTAMP",
    "ended_at": "TIMESTAMP",
    "ttfb_ms": "DOUBLE",
    "duration_ms": "DOUBLE",
    "run": "VARCHAR",
    "episode": "VARCHAR",
    "item": "VARCHAR",
    "condition": "VARCHAR",
    "upstream": "VARCHAR",
    "method": "VARCHAR",
    "path": "VARCHAR",
    "query": "VARCHAR",
    "status": "INTEGER",
    "client_status": "INTEGER",
    "error_kind": "VARCHAR",
    "error_message": "VARCHAR",
    "condition_note": "VARCHAR",
}
# Every typed field, in the order the first that does not fit is named: the bodies first.
FIELDS = {**BODIES, **STORED}


def _with_article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def misfit(name: str, value: Any, kind: str) -> str | None:
    """Why `value` cannot be field (or column) `name` of type `kind`, or None if it can (null always can)."""
    if value is None or FITS[kind](value):
        return None
    try:
        shown = orjson.dumps(value, default=str).decode()
    except TypeError:  # an int beyond 64 bits (orjson's own limit)
        shown = str(value)
    if len(shown) > 60:
        shown = shown[:59] + "…"
    return f'"{name}" is {shown} ({_with_article(json_type(value))}), which does not fit {WORDS[kind]}'


_NONE = type(None)
# Per type, the Python types its values may have (bool is no int here: type() is compared, not isinstance).
_PY_TYPES = {
    "VARCHAR": frozenset({str, _NONE}),
    "JSON": frozenset({str, _NONE}),
    "INTEGER": frozenset({int, _NONE}),
    "BIGINT": frozenset({int, _NONE}),
    "DOUBLE": frozenset({int, float, _NONE}),
    "TIMESTAMP": frozenset({int, float, _NONE}),
    "BOOLEAN": frozenset({bool, _NONE}),
    "VARCHAR[]": frozenset({list, _NONE}),
}
_NAMES = tuple(FIELDS)
_VALUES = operator.itemgetter(*_NAMES)
_ALLOWED = tuple(_PY_TYPES[FIELDS[name]] for name in _NAMES)
# The fields whose type alone does not decide: their place in _NAMES and the bounds their values
# must be strictly within.
_EXCLUSIVE = {
    "INTEGER": (INT32[0] - 1, INT32[1] + 1),
    "BIGINT": (INT64[0] - 1, INT64[1] + 1),
    "TIMESTAMP": (-EPOCH_SECONDS, EPOCH_SECONDS),
}
_BOUNDED = tuple((i, *_EXCLUSIVE[FIELDS[name]]) for i, name in enumerate(_NAMES) if FIELDS[name] in _EXCLUSIVE)
# Type signatures (each field's Python type, in _NAMES order) seen to fit: the proxy writes few.
_FITTING: set[tuple[type, ...]] = set()


def first_misfit(rec: dict[str, Any]) -> str | None:
    """The first typed field of `rec` whose value does not fit (FIELDS order), in words; or None.

    analyze asks this of every record, so the common case is a few passes in C: the record's type
    signature is looked up among those seen to fit, then the few bounded values are compared.
    Only a record that fails that is looked at field by field, for the words.
    """
    try:
        values = _VALUES(rec)
    except KeyError:  # a field left out (an older record, one written by hand): null, which fits
        values = tuple(map(rec.get, _NAMES))
    signature = tuple(map(type, values))
    fits = signature in _FITTING
    if not fits and all(map(frozenset.__contains__, _ALLOWED, signature)):
        fits = True
        if len(_FITTING) < 1024:
            _FITTING.add(signature)
    if fits:
        for i, low, high in _BOUNDED:
            value = values[i]
            if value is not None and not low < value < high:
                break
        else:
            return None
    for name, kind in FIELDS.items():
        problem = misfit(name, rec.get(name), kind)
        if problem is not None:
            return problem
    return None


@dataclass(frozen=True, slots=True)
class Issue:
    """A line set aside: where it is, why (`kind`, one of SET_ASIDE or a reader's own), in words."""

    segment: str
    offset: int
    kind: str
    message: str
    record_id: str | None = None

    def line(self) -> str:
        return f"{self.segment} @{self.offset}: {self.message}"


def unreadable(error: str) -> tuple[str, str]:
    """(issue kind, message) for a line that is no record at all (segments.parse_line's error)."""
    return CORRUPT, f"{error}; skipped"


def verdict(rec: dict[str, Any]) -> tuple[str, str] | None:
    """(issue kind, message) for a parsed record that cannot be used, or None when it can."""
    rid = rec.get("id")
    if not isinstance(rid, str) or not rid:
        return CORRUPT, "record has no id; skipped"
    kind = rec.get("kind", EXCHANGE)
    if isinstance(kind, str) and kind not in KINDS:
        return UNKNOWN_KIND, f"record kind {kind!r} is not known to this analyzer; skipped"
    problem = first_misfit(rec)
    if problem is not None:
        return BAD_TYPE, f"record {rid}: {problem}; set aside"
    if kind not in KINDS:  # null
        return UNKNOWN_KIND, f"record kind {kind!r} is not known to this analyzer; skipped"
    return None


@dataclass(frozen=True, slots=True)
class Checked:
    """One line of a segment as a reader gets it: the record, or the issue it was set aside for."""

    segment: str
    offset: int
    record: dict[str, Any] | None
    issue: Issue | None


def read_checked(data_dir: str | Path) -> Iterator[Checked]:
    """Every complete line of every segment under `data_dir` in write order, checked: a record
    with its bodies put back, or an issue. Torn tails (a line being written, or cut by a crash)
    are no line yet and are skipped."""
    for path in list_segments(data_dir):
        for line in read_segment(path):
            if line.record is None:
                if line.error != "torn_tail":
                    yield Checked(path.name, line.offset, None, Issue(path.name, line.offset, *unreadable(line.error)))
                continue
            bad = verdict(line.record)
            if bad is None:
                yield Checked(path.name, line.offset, line.record, None)
            else:
                rid = line.record.get("id")
                yield Checked(
                    path.name,
                    line.offset,
                    None,
                    Issue(path.name, line.offset, bad[0], bad[1], rid if isinstance(rid, str) else None),
                )
