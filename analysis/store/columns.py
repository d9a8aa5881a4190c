"""Python values against the DuckDB column types the analyzer stores them in.

A value that does not fit its column fails the CAST at insert, and a failed statement aborts the
whole ingest transaction: one odd record would stop every later one from being stored. So every
value is checked here first, in Python, where the answer can name the field and the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from toolproxy.record.schema import EPOCH_SECONDS, FITS, INT32, INT64, misfit

__all__ = ["Columns", "misfit", "share_strings"]  # misfit: the record reader's, which words a column's misfit too

_TEXT = {str, type(None)}


def share_strings(values: Sequence) -> Sequence:
    """The values with equal strings made one object: a column whose values repeat (a run's name,
    its model, a stack's headers) then holds one object per distinct value, and pickle sends a
    repeat as a reference. Only a column of text and None: 1, 1.0 and True are equal dict keys but
    not equal column values, so any other column comes back as it was."""
    if not set(map(type, values)) <= _TEXT:
        return values
    first: dict[str | None, str | None] = {}
    return tuple(map(first.setdefault, values, values))


_NONE = type(None)
_BOUNDS = {"INTEGER": INT32, "BIGINT": INT64, "TIMESTAMP": (-EPOCH_SECONDS, EPOCH_SECONDS)}
_PY_TYPES = {
    "VARCHAR": {str, _NONE},
    "JSON": {str, _NONE},
    "INTEGER": {int, _NONE},
    "BIGINT": {int, _NONE},
    "DOUBLE": {int, float, _NONE},
    "TIMESTAMP": {int, float, _NONE},
    "BOOLEAN": {bool, _NONE},
    "VARCHAR[]": {list, _NONE},
}


def _column_fits(values: list, sql_type: str) -> bool:
    """Whether every value fits, decided by C-level passes over the column (no call per value)."""
    if not set(map(type, values)) <= _PY_TYPES[sql_type]:
        return False
    bounds = _BOUNDS.get(sql_type)
    if bounds is not None:
        present = list(filter(None, values))  # zero is in every range
        return not present or (bounds[0] <= min(present) and max(present) <= bounds[1])
    if sql_type == "VARCHAR[]":
        return all(set(map(type, v)) <= {str} for v in filter(None, values))
    return True


class Columns:
    """The column types of one table, checked a column at a time.

    Every record of an ingest goes through here, so the common case (everything fits) costs a
    few C-level passes per column of a batch; only a column that fails them is looked at value
    by value.
    """

    def __init__(self, types: dict[str, str]) -> None:
        self.types = types

    def misfit(self, values: dict[str, Any]) -> str | None:
        """The first of the columns' values in `values` (one record) that does not fit, as misfit says."""
        for name, sql_type in self.types.items():
            if problem := misfit(name, values.get(name), sql_type):
                return problem
        return None

    def misfits(self, columns: dict[str, list], names: list[str]) -> dict[int, str]:
        """Rows (by index) where one of the columns `names` holds a value that does not fit, and why."""
        found: dict[int, str] = {}
        for name in names:
            sql_type, values = self.types[name], columns[name]
            if _column_fits(values, sql_type):
                continue
            for i, value in enumerate(values):
                if i not in found and (problem := misfit(name, value, sql_type)):
                    found[i] = problem
        return found

    def fit(self, columns: dict[str, list]) -> dict[str, list]:
        """`columns` with every value that does not fit made to: text as JSON, anything else NULL.

        For values read out of bodies, which a model or a stack wrote: the exchange is still
        stored, its raw body keeps the original, and the column holds what SQL can compare.
        """
        out = dict(columns)
        for name, values in columns.items():
            sql_type = self.types[name]
            if _column_fits(values, sql_type):
                continue
            text = sql_type in ("VARCHAR", "JSON")
            out[name] = [
                v if v is None or FITS[sql_type](v) else (orjson.dumps(v, default=str).decode() if text else None)
                for v in values
            ]
        return out
