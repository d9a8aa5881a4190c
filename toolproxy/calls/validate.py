"""Does a call name an offered tool, and do its arguments satisfy that tool's JSON Schema?

Schemas are checked with jsonschema under the dialect (JSON Schema's own word) their `$schema`
names, Draft 2020-12 when they name none. jsonschema's semantics are kept as they are, including
that 3.0 *is* an integer (Draft 4 and later define integers by value, not by spelling; only
Draft 3 rejects it). A tool
schema that is itself invalid, or that cannot be used (an unresolvable `$ref`: remote references
are never fetched), makes the call "not validated" instead of failing the analysis.

jsonschema is exact but slow (tens of microseconds per call, most of the analyzer's classification
time). So each usable Draft 2020-12 schema is also compiled into a plain predicate (`_accepts`) that
covers the keywords tool schemas use. It only ever says "valid": when it cannot say (a keyword it
does not implement, a value that is not a plain JSON type) or when the arguments fail it, jsonschema
runs as before and produces the error list, so stored results and messages are jsonschema's own."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from toolproxy.term.jsontype import json_type

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


_VALID = Validation(True, True, True, ())


@dataclass(frozen=True, slots=True)
class _Checker:
    """A tool schema made ready: jsonschema's validator (None when the schema cannot be used, and
    `problem` says why) and, when the schema only uses keywords `_compile` knows, the fast check."""

    validator: Any
    problem: str
    accepts: Callable[[Any], bool] | None


# (tools_key, name) -> the checker of that offered tool, or None when the name was not offered.
_BY_TOOLS_KEY: dict[tuple[str, str], _Checker | None] = {}


def validate_call(
    name: str | None, arguments: Any, tools: list[dict] | None, *, tools_key: str | None = None
) -> Validation:
    """Check one call against the request's tools. Arguments may be a JSON string (decoded
    first), an object, or None (no arguments: validated as {}). To report a text call whose
    arguments did not parse, pass its `raw_arguments`: they fail here as "not valid JSON".

    `tools_key`, a content hash of `tools` (the analyzer's tool_set), lets the schema lookup be
    reused: looking the tool up and canonicalising its schema costs more than validating."""
    if name is None:
        return Validation(False, False, False, ("no tool name",))
    checker = _checker(name, tools) if tools_key is None else _keyed_checker(name, tools, tools_key)
    if checker is None:
        return Validation(False, False, False, (f"tool {name!r} was not offered",))
    validator = checker.validator
    value, error = parse_arguments(arguments)
    if error is not None:
        return Validation(True, validator is not None, False, (error,))
    if not isinstance(value, dict):
        return Validation(
            True, validator is not None, False, (f"arguments must be a JSON object, not {json_type(value)}",)
        )
    if validator is None:
        return Validation(True, False, True, (checker.problem,))
    if checker.accepts is not None:
        try:
            if checker.accepts(value):
                return _VALID
        except Exception:  # noqa: BLE001 - _Unsure, or anything odd: jsonschema decides below
            pass
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    except Exception as exc:  # noqa: BLE001 - unusable schema ($ref, regex...) means "not validated"
        return Validation(True, False, True, (f"tool schema could not be applied: {type(exc).__name__}: {exc}",))
    messages = tuple(_describe(e) for e in errors[:_MAX_ERRORS])
    return Validation(True, True, not messages, messages)


def _checker(name: str, tools: list | None) -> _Checker | None:
    schemas = offered_tools(tools)
    return _prepared(_schema_key(schemas[name])) if name in schemas else None


def _keyed_checker(name: str, tools: list | None, tools_key: str) -> _Checker | None:
    key = (tools_key, name)
    try:
        return _BY_TOOLS_KEY[key]
    except KeyError:
        pass
    if len(_BY_TOOLS_KEY) >= 4096:
        _BY_TOOLS_KEY.clear()
    checker = _BY_TOOLS_KEY[key] = _checker(name, tools)
    return checker


def _schema_key(schema: Any) -> str:
    try:
        return json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return "\0invalid"


@lru_cache(maxsize=512)
def _prepared(key: str) -> _Checker:
    """The checker for a schema given as canonical JSON."""
    validator, problem = _validator(key)
    accepts = _compile(validator.schema) if type(validator) is Draft202012Validator else None
    return _Checker(validator, problem, accepts)


def _validator(key: str) -> tuple[Any, str]:
    """A ready jsonschema validator for a schema (as canonical JSON), or None and why it cannot be used."""
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


# --- the fast check -------------------------------------------------------------------------
# A compiled check returns True only when Draft 2020-12 jsonschema (no format checker, as
# _validator builds it) would report no error for the value, and then jsonschema is not run; any
# other answer sends the call to jsonschema. A value that is not a plain JSON type raises _Unsure,
# and a schema using a keyword not handled here is not compiled at all. anyOf, oneOf and not are
# left to jsonschema on purpose: they pass while sub-schemas fail, and jsonschema formats those
# failures' messages (a repr of the value), which can itself raise and change the stored result.


class _Unsure(Exception):
    """A value the fast check does not judge (not a plain JSON type)."""


_NONE = type(None)
_JSON_TYPES = frozenset({dict, list, str, int, float, bool, _NONE})
Check = Callable[[Any], bool]
# keyword check: (value, its exact type) -> no error from this keyword
KeywordCheck = Callable[[Any, type], bool]


def _is_integer(v: Any, t: type) -> bool:
    return t is int or (t is float and v.is_integer())


# JSON type name -> test on (value, exact type); bool is its own type, never a number.
_TYPE_TESTS: dict[str, KeywordCheck] = {
    "object": lambda v, t: t is dict,
    "array": lambda v, t: t is list,
    "string": lambda v, t: t is str,
    "boolean": lambda v, t: t is bool,
    "null": lambda v, t: t is _NONE,
    "number": lambda v, t: t is int or t is float,
    "integer": _is_integer,
}


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


def _compile(schema: Any) -> Check | None:
    """The exact check for a (valid, Draft 2020-12) schema, or None if it uses anything else."""
    if schema is True:
        return _always
    if schema is False:
        return _never
    if not isinstance(schema, dict):
        return None
    checks: list[KeywordCheck] = []
    for keyword, value in schema.items():
        if keyword not in Draft202012Validator.VALIDATORS:
            continue  # annotations and unknown keywords: jsonschema ignores them too
        if keyword == "format":
            continue  # only asserted with a format checker, and _validator sets none
        make = _KEYWORDS.get(keyword)
        check = make(value, schema) if make is not None else None
        if check is None:
            return None
        checks.append(check)
    if not checks:
        return _plain_json
    if len(checks) == 1:
        only = checks[0]

        def single(v: Any) -> bool:
            t = type(v)
            if t not in _JSON_TYPES:
                raise _Unsure
            return only(v, t)

        return single

    def every(v: Any) -> bool:
        t = type(v)
        if t not in _JSON_TYPES:
            raise _Unsure
        for check in checks:
            if not check(v, t):
                return False
        return True

    return every


def _plain_json(value: Any) -> bool:
    """A schema without assertions accepts everything; judged only for plain JSON values so that
    the rule 'other types are left to jsonschema' has no exception."""
    if type(value) not in _JSON_TYPES:
        raise _Unsure
    return True


def _subschemas(values: Any) -> list[Check] | None:
    if not isinstance(values, list):
        return None
    checks = [_compile(v) for v in values]
    return None if any(c is None for c in checks) else checks


def _type(value: Any, schema: dict) -> KeywordCheck | None:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPE_TESTS for n in names):
        return None
    tests = [_TYPE_TESTS[n] for n in names]
    if len(tests) == 1:
        return tests[0]
    return lambda v, t: any(test(v, t) for test in tests)


def _properties(value: Any, schema: dict) -> KeywordCheck | None:
    if not isinstance(value, dict):
        return None
    subs = {name: _compile(sub) for name, sub in value.items()}
    if any(c is None for c in subs.values()):
        return None
    pairs = tuple(subs.items())

    def properties(v: Any, t: type) -> bool:
        if t is dict:
            for name, check in pairs:
                if name in v and not check(v[name]):
                    return False
        return True

    return properties


def _required(value: Any, schema: dict) -> KeywordCheck | None:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        return None
    names = tuple(value)
    return lambda v, t: t is not dict or all(n in v for n in names)


def _additional_properties(value: Any, schema: dict) -> KeywordCheck | None:
    known = schema.get("properties", {})
    if not isinstance(known, dict) or "patternProperties" in schema:
        return None
    if value is False:
        return lambda v, t: t is not dict or all(k in known for k in v)
    check = _compile(value)
    if check is None:
        return None
    return lambda v, t: t is not dict or all(check(v[k]) for k in v if k not in known)


def _json_equal(one: Any, two: Any) -> bool:
    """Equality as jsonschema judges enum and const: a bool is never a number, also inside
    arrays and objects (1 != True, [0] != [False]), while 1 == 1.0. Only plain JSON types are
    judged; anything else raises _Unsure and jsonschema decides."""
    if one is two:
        return True
    t1, t2 = type(one), type(two)
    if t1 not in _JSON_TYPES or t2 not in _JSON_TYPES:
        raise _Unsure
    if t1 is list and t2 is list:
        return len(one) == len(two) and all(map(_json_equal, one, two))
    if t1 is dict and t2 is dict:
        return len(one) == len(two) and all(k in two and _json_equal(v, two[k]) for k, v in one.items())
    if t1 is bool or t2 is bool:
        return t1 is t2 and one == two
    return one == two


def _enum(value: Any, schema: dict) -> KeywordCheck | None:
    if not isinstance(value, list):
        return None
    # For a string instance jsonschema's equality is ==, which `in` applies (after identity).
    return lambda v, t: v in value if t is str else any(_json_equal(e, v) for e in value)


def _const(value: Any, schema: dict) -> KeywordCheck:
    return lambda v, t: _json_equal(v, value)


def _items(value: Any, schema: dict) -> KeywordCheck | None:
    check = _compile(value)
    if check is None or "prefixItems" in schema:
        return None
    return lambda v, t: t is not list or all(check(e) for e in v)


def _bound(test: Callable[[Any, Any], bool], applies: tuple[type, ...], measure: Callable[[Any], Any] | None = None):
    """A keyword comparing the instance (or its length) with the keyword's number."""

    def make(value: Any, schema: dict) -> KeywordCheck | None:
        if type(value) not in (int, float):
            return None
        if measure is None:
            return lambda v, t: t not in applies or test(v, value)
        return lambda v, t: t not in applies or test(measure(v), value)

    return make


_NUMBERS = (int, float)


def _pattern(value: Any, schema: dict) -> KeywordCheck | None:
    if not isinstance(value, str):
        return None
    try:
        search = re.compile(value).search  # jsonschema calls re.search(pattern, instance)
    except (re.error, RecursionError, OverflowError):
        return None
    return lambda v, t: t is not str or search(v) is not None


def _all_of(value: Any, schema: dict) -> KeywordCheck | None:
    checks = _subschemas(value)
    return None if checks is None else (lambda v, t: all(c(v) for c in checks))


_KEYWORDS: dict[str, Callable[[Any, dict], KeywordCheck | None]] = {
    "type": _type,
    "properties": _properties,
    "required": _required,
    "additionalProperties": _additional_properties,
    "enum": _enum,
    "const": _const,
    "items": _items,
    "pattern": _pattern,
    "allOf": _all_of,
    # Each written as the negation of jsonschema's own failing comparison (they differ for NaN).
    "minimum": _bound(lambda x, b: not x < b, _NUMBERS),
    "maximum": _bound(lambda x, b: not x > b, _NUMBERS),
    "exclusiveMinimum": _bound(lambda x, b: not x <= b, _NUMBERS),
    "exclusiveMaximum": _bound(lambda x, b: not x >= b, _NUMBERS),
    "minLength": _bound(lambda x, b: not x < b, (str,), len),
    "maxLength": _bound(lambda x, b: not x > b, (str,), len),
    "minItems": _bound(lambda x, b: not x < b, (list,), len),
    "maxItems": _bound(lambda x, b: not x > b, (list,), len),
    "minProperties": _bound(lambda x, b: not x < b, (dict,), len),
    "maxProperties": _bound(lambda x, b: not x > b, (dict,), len),
}


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
