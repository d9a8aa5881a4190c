"""A parsed JSON value's type, named as JSON names it, for messages about a value that does not fit
(a tool's arguments against their schema, a record's field against its column)."""

from __future__ import annotations

from typing import Any


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value, as messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__
