"""validate_call's compiled fast check against jsonschema itself, over a grid of schemas x values.

The fast check (validate._compile, for Draft 2020-12 schemas) may only ever answer "valid" when jsonschema finds no
error, and
validate_call must return exactly what the jsonschema-only path returns (offered, validated, valid
and the error messages in their order). Both are checked for every pair below, including hostile
values: wrong JSON types, bool where numbers are wanted, huge and non-finite numbers, deep
nesting, unicode and lone surrogates, and values that are not JSON types at all."""

from __future__ import annotations

import decimal
import itertools
from collections import OrderedDict

import pytest
from jsonschema import Draft202012Validator

from toolproxy.calls import Validation, validate_call
from toolproxy.calls import validate as V

OBJ = {"type": "object"}
SCHEMAS = [
    # the shapes real tool schemas have
    {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"], "type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"limit": {"type": "integer"}, "query": {"type": "string", "description": "q", "format": "uri"}},
        "required": ["query"],
    },
    {"type": "object", "properties": {"timeout": {"type": "number", "minimum": 0, "exclusiveMaximum": 600}}},
    {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 3},
                "minItems": 1,
                "maxItems": 2,
            }
        },
    },
    {
        "type": "object",
        "properties": {
            "opts": {
                "type": "object",
                "properties": {"deep": {"type": "boolean"}},
                "required": ["deep"],
                "additionalProperties": {"type": "integer"},
            }
        },
    },
    {"type": "object", "properties": {"n": {"type": ["integer", "null"], "maximum": 10, "exclusiveMinimum": -1}}},
    {"type": "object", "properties": {"k": {"enum": [1, True, None, "1", [1], {"a": 1}, 0.0]}}},
    {"type": "object", "properties": {"k": {"const": 1}, "z": {"const": {"a": [1, 2]}}}},
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-z]+\\d?$"}}},
    {
        "type": "object",
        "properties": {"é": {"type": "string"}},
        "required": ["é"],
        "minProperties": 1,
        "maxProperties": 2,
    },
    {"type": "object", "allOf": [{"required": ["a"]}, {"properties": {"a": {"type": "string"}}}]},
    {"type": "object", "properties": {"x": True, "y": False}, "additionalProperties": True},
    {"type": "object", "properties": {"a": {"items": False}}, "x-vendor": {"type": "string"}, "title": "t"},
    {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["a"]},
    {},
    True,
    # left to jsonschema: the fast check must not compile these
    {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
    {"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}, {"minimum": 2}]}}},
    {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/s"}}, "$defs": {"s": {"type": "string"}}},
    {"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{"type": "string"}], "items": False}}},
    {"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0.1}}},
    {"type": "object", "properties": {"a": {"uniqueItems": True}}},
    {"type": "object", "dependentRequired": {"a": ["b"]}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"a": {"type": "integer"}}},
]
# Which of SCHEMAS the fast check compiles (the rest are the "left to jsonschema" ones).
COMPILED = 17

SCALARS = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    3.0,
    3.5,
    -0.0,
    10,
    11,
    600,
    599.999,
    10**30,
    -(10**30),
    1e308,
    float("inf"),
    float("-inf"),
    "",
    "a",
    "ab1",
    "abcd",
    "é",
    "\ud800",
    "1",
    "c",
    "f",
    "k",
]
VALUES = [
    {},
    {"expression": "1+1"},
    {"expression": 1},
    {"expression": "1", "extra": None},
    {"Expression": "x"},
    {"city": "Paris", "unit": "c"},
    {"city": "Paris", "unit": "k"},
    {"city": None},
    {"unit": "f"},
    {"query": "q", "limit": 3.0},
    {"query": "q", "limit": 3.5},
    {"query": "q", "limit": True},
    {"query": "q", "limit": 10**40},
    {"timeout": 0},
    {"timeout": -1e-300},
    {"timeout": 600},
    {"timeout": "5"},
    {"timeout": float("nan")},
    {"tags": []},
    {"tags": ["a"]},
    {"tags": ["a", "bcde"]},
    {"tags": ["a", "b", "c"]},
    {"tags": ["", "é"]},
    {"tags": "a"},
    {"opts": {"deep": True}},
    {"opts": {"deep": 1}},
    {"opts": {"deep": False, "n": 2}},
    {"opts": {"deep": False, "n": "2"}},
    {"opts": []},
    {"n": None},
    {"n": 0},
    {"n": -1},
    {"n": 10.0},
    {"n": 11},
    {"n": False},
    {"k": 1},
    {"k": True},
    {"k": 1.0},
    {"k": False},
    {"k": 0},
    {"k": [1]},
    {"k": [True]},
    {"k": {"a": 1}},
    {"k": {"a": True}},
    {"k": "1"},
    {"z": {"a": [1, 2]}},
    {"z": {"a": [1, 2.0]}},
    {"z": {"a": [True, 2]}},
    {"s": "abc"},
    {"s": "abc1"},
    {"s": "ABC"},
    {"s": "abc\n"},
    {"s": 5},
    {"é": "x"},
    {"é": "x", "b": 1},
    {"é": "x", "b": 1, "c": 2},
    {"e": "x"},
    {"a": "x"},
    {"a": 1},
    {"a": [1]},
    {"a": []},
    {"a": None},
    {"a": 1.0},
    {"a": 1.05},
    {"a": [1, 1]},
    {"a": "x", "b": 1},
    {"x": 1},
    {"y": 1},
    {"x1": 1},
    {"x1": "1"},
    {"deep": {"deep": {"deep": {"deep": [[[[{"\U0001f600": "\x00"}]]]]}}}},
    *({"value": v, "n": v, "k": v, "a": v, "s": v, "timeout": v, "expression": v} for v in SCALARS),
]
# Not JSON types: the fast check must step aside (and the result still be jsonschema's).
ODD = [{"a": decimal.Decimal("1.5")}, {"n": decimal.Decimal(3)}, OrderedDict(a="x"), {"a": ("x",)}, {"k": 1 + 0j}]


def _jsonschema_only(schema, value) -> Validation:
    """What validate_call answered before the fast check existed: jsonschema's errors, described."""
    cls = V.validator_for(schema, default=Draft202012Validator) if isinstance(schema, dict) else Draft202012Validator
    try:
        errors = sorted(cls(schema).iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    except Exception as exc:  # e.g. multipleOf on infinity
        return Validation(True, False, True, (f"tool schema could not be applied: {type(exc).__name__}: {exc}",))
    messages = tuple(V._describe(e) for e in errors[: V._MAX_ERRORS])
    return Validation(True, True, not messages, messages)


def _fast_check(schema):
    return V._prepared(V._schema_key(schema)).accepts


def test_the_fast_check_covers_the_usual_shapes_and_only_those():
    compiled = [_fast_check(s) is not None for s in SCHEMAS]
    assert compiled == [True] * COMPILED + [False] * (len(SCHEMAS) - COMPILED)


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_validate_call_equals_jsonschema(index):
    schema = SCHEMAS[index]
    tools = [{"type": "function", "function": {"name": "t", "parameters": schema}}]
    check = _fast_check(schema)
    agreed = 0
    for value in itertools.chain(VALUES, ODD):
        expected = _jsonschema_only(schema, value)
        assert validate_call("t", value, tools) == expected, value
        assert validate_call("t", value, tools, tools_key=f"set{index}") == expected, value
        if check is not None:
            try:
                fast = check(value)
            except V._Unsure:
                assert value in ODD
                continue
            assert fast == expected.valid, value  # exact, not just never wrongly "valid"
            agreed += 1
    assert check is None or agreed >= len(VALUES)


def test_a_schema_the_fast_check_rejects_still_gets_jsonschemas_messages():
    schema = SCHEMAS[1]
    tools = [{"type": "function", "function": {"name": "t", "parameters": schema}}]
    result = validate_call("t", '{"city": 7, "unit": "k", "zzz": 1}', tools, tools_key="k")
    assert result.errors == (
        "additional property at $: Additional properties are not allowed ('zzz' was unexpected)",
        "wrong type at $.city: 7 is not of type 'string'",
        "enum at $.unit: 'k' is not one of ['c', 'f']",
    )


EQUALITY_CASES = [
    None,
    True,
    False,
    0,
    1,
    1.0,
    -0.0,
    0.0,
    2,
    float("nan"),
    float("inf"),
    "",
    "1",
    "a",
    [],
    [1],
    [True],
    [1.0],
    [0],
    [False],
    [[1]],
    [[True]],
    {},
    {"a": 1},
    {"a": True},
    {"a": 1.0},
    {"b": 1},
    {"a": 1, "b": 2},
    {"a": [False]},
    {"a": [0]},
    [1, 2],
    [2, 1],
    [{"a": None}],
    [{"a": 0}],
]


@pytest.mark.parametrize("one", EQUALITY_CASES, ids=repr)
def test_json_equality_is_jsonschemas_const(one):
    """The fast check's enum/const equality answers what jsonschema's const keyword answers, for
    every pair of JSON values that tell bool, int, float, nesting and key sets apart."""
    validator = Draft202012Validator({"const": one})
    for two in EQUALITY_CASES:
        assert V._json_equal(two, one) == validator.is_valid(two), (one, two)
        assert V._json_equal(one, two) == V._json_equal(two, one), (one, two)


def test_json_equality_steps_aside_for_values_that_are_not_json():
    for one, two in [(decimal.Decimal(1), 1), ([1], (1,)), ({"a": decimal.Decimal("1.5")}, {"a": 1.5})]:
        with pytest.raises(V._Unsure):
            V._json_equal(one, two)
