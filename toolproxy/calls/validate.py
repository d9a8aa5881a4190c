"""Does a call name an offered tool, and do its arguments satisfy that tool's JSON Schema?

Schemas are checked with jsonschema under the dialect their `$schema` names, Draft 2020-12 when
they name none. jsonschema's semantics are kept as they are, including that 3.0 *is* an integer
(Draft 4 and later define integers by value, not by spelling; only Draft 3 rejects it). A tool
schema that is itself invalid, or that cannot be used (an unresolvable `$ref`: remote references
are never fetched), makes the call "not validated" instead of failing the analysis."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from .jsontext import parse_arguments

_MAX_ERRORS = 20


@dataclass(frozen=True, slots=True)
class Validation:
    offered: bool
    validated: bool
    valid: bool
    errors: tuple[str, ...]


def offered_tools(tools: list | None) -> dict[str, dict]:
    """name -> parameters schema for an OpenAI-style `tools` array. Also accepts Ollama's (same
    shape), the Responses API's flat `{"type": "function", "name", "parameters"}` and bare
    `{"name", "parameters"}` entries. A tool without parameters takes any object ({}); entries
    without a string name are ignored; the first of two same-named tools wins."""
    out: dict[str, dict] = {}
    if not isinstance(tools, list):
        return out
    for entry in tools:
        if not isinstance(entry, dict):
            continue
        spec = entry.get("function") if isinstance(entry.get("function"), dict) else entry
        name = spec.get("name")
        if not isinstance(name, str) or name in out:
            continue
        params = spec.get("parameters", spec.get("input_schema"))
        out[name] = {} if params is None else params
    return out


def validate_call(name: str | None, arguments: Any, tools: list[dict] | None) -> Validation:
    """Check one call against the request's tools. Arguments may be a JSON string (decoded
    first), an object, or None (no arguments: validated as {}). To report a text call whose
    arguments did not parse, pass its `raw_arguments`: they fail here as "not valid JSON"."""
    schemas = offered_tools(tools)
    if name is None or name not in schemas:
        shown = "no tool name" if name is None else f"tool {name!r} was not offered"
        return Validation(False, False, False, (shown,))
    validator, problem = _validator(_schema_key(schemas[name]))
    value, error = parse_arguments(arguments)
    if error is not None:
        return Validation(True, validator is not None, False, (error,))
    if not isinstance(value, dict):
        return Validation(True, validator is not None, False, (f"arguments must be a JSON object, not {json_type(value)}",))
    if validator is None:
        return Validation(True, False, True, (problem,))
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    except Exception as exc:  # noqa: BLE001 - unusable schema ($ref, regex...) means "not validated"
        return Validation(True, False, True, (f"tool schema could not be applied: {type(exc).__name__}: {exc}",))
    messages = tuple(_describe(e) for e in errors[:_MAX_ERRORS])
    return Validation(True, True, not messages, messages)


def _schema_key(schema: Any) -> str:
    try:
        return json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return "\0invalid"


@lru_cache(maxsize=512)
def _validator(key: str) -> tuple[Any, str]:
    """A ready validator for a schema (as canonical JSON), or None and why it cannot be used."""
    if key == "\0invalid":
        return None, "tool schema is not JSON"
    schema = json.loads(key)
    if not isinstance(schema, (dict, bool)):
        return None, f"tool schema must be an object, not {json_type(schema)}"
    try:
        cls = validator_for(schema, default=Draft202012Validator) if isinstance(schema, dict) else Draft202012Validator
        cls.check_schema(schema)
        return cls(schema), ""
    except SchemaError as exc:
        return None, f"tool schema is invalid: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - e.g. an unknown $schema URI
        return None, f"tool schema is unusable: {type(exc).__name__}: {exc}"


def _describe(error: Any) -> str:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    validator = error.validator
    if validator == "required":
        kind = "missing required"
    elif validator == "additionalProperties":
        kind = "additional property"
    elif validator == "type":
        kind = "wrong type"
    else:
        kind = str(validator)
    return f"{kind} at ${where}: {error.message}"


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
