"""Python values against the DuckDB column types the analyzer stores them in.

A value that does not fit its column fails the CAST at insert, and a failed statement aborts the
whole ingest transaction: one odd record would stop every later one from being stored. So every
value is checked here first, in Python, where the answer can name the field and the value.
"""

from __future__ import annotations

from typing import Any

import orjson

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
# Epoch seconds DuckDB can hold as a TIMESTAMP (microseconds in an int64, about +-292,000 years).
_EPOCH_SECONDS = 9.2e12

_WORDS = {
    "VARCHAR": "a string",
    "JSON": "JSON text",
    "INTEGER": "a 32-bit integer",
    "BIGINT": "a 64-bit integer",
    "DOUBLE": "a number",
    "TIMESTAMP": "a time in seconds since 1970",
    "BOOLEAN": "true or false",
    "VARCHAR[]": "a list of strings",
}


def _is_int(value: Any, bounds: tuple[int, int]) -> bool:
    return type(value) is int and bounds[0] <= value <= bounds[1]


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


_FITS = {
    "VARCHAR": lambda v: type(v) is str,
    "JSON": lambda v: type(v) is str,
    "INTEGER": lambda v: _is_int(v, _INT32),
    "BIGINT": lambda v: _is_int(v, _INT64),
    "DOUBLE": _is_number,
    "TIMESTAMP": lambda v: _is_number(v) and -_EPOCH_SECONDS < v < _EPOCH_SECONDS,
    "BOOLEAN": lambda v: type(v) is bool,
    "VARCHAR[]": lambda v: type(v) is list and all(type(x) is str for x in v),
}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def misfit(name: str, value: Any, sql_type: str) -> str | None:
    """Why `value` cannot be stored in column `name` of `sql_type`, or None if it can (NULL always can)."""
    if value is None or _FITS[sql_type](value):
        return None
    shown = orjson.dumps(value, default=str).decode()
    if len(shown) > 60:
        shown = shown[:59] + "…"
    return f'"{name}" is {shown} ({_json_type(value)}), which does not fit {_WORDS[sql_type]}'


def first_misfit(values: dict[str, Any], types: dict[str, str]) -> str | None:
    """The first of `values` (column -> value) that does not fit its column type in `types`."""
    for name, value in values.items():
        if value is not None and not _FITS[types[name]](value):
            return misfit(name, value, types[name])
    return None


def fitted(row: tuple, types: dict[str, str]) -> tuple:
    """`row` (values in `types` order) with every value that does not fit made to: text as JSON,
    anything else NULL.

    For values read out of bodies, which a model or a stack wrote: the exchange is still stored,
    its raw body keeps the original, and the column holds what can be compared in SQL.
    """
    out = None
    for i, (value, sql_type) in enumerate(zip(row, types.values())):
        if value is None or _FITS[sql_type](value):
            continue
        if out is None:
            out = list(row)
        out[i] = orjson.dumps(value, default=str).decode() if sql_type in ("VARCHAR", "JSON") else None
    return row if out is None else tuple(out)
