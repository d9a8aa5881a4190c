"""validate_call / offered_tools / parse_arguments: one row per case."""

import pytest

from toolproxy.calls import Validation, offered_tools, parse_arguments, validate_call

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "no_params", "description": "takes nothing"}},
    {"type": "function", "function": {"name": "broken_schema", "parameters": {"type": "objekt"}}},
    {"type": "function", "function": {"name": "string_schema", "parameters": "not a schema"}},
    {"type": "function", "function": {"name": "dangling_ref", "parameters": {"$ref": "#/$defs/missing"}}},
    {
        "type": "function",
        "function": {"name": "remote_ref", "parameters": {"$ref": "https://example.invalid/schema.json"}},
    },
    {
        "type": "function",
        "function": {
            "name": "draft4",
            "parameters": {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "type": "object",
                "properties": {"n": {"type": "number", "maximum": 10, "exclusiveMaximum": True}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "draft3",
            "parameters": {
                "$schema": "http://json-schema.org/draft-03/schema#",
                "type": "object",
                "properties": {"n": {"type": "integer"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "exclusive_bool_2020",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "number", "maximum": 10, "exclusiveMaximum": True}},
            },
        },
    },
]


@pytest.mark.parametrize(
    "name,arguments,offered,validated,valid,error_parts",
    [
        ("get_weather", {"city": "Paris"}, True, True, True, []),
        ("get_weather", '{"city": "Paris", "days": 3}', True, True, True, []),  # OpenAI string arguments
        ("get_weather", {}, True, True, False, ["missing required", "'city' is a required property"]),
        ("get_weather", {"city": 7}, True, True, False, ["wrong type at $.city", "7 is not of type 'string'"]),
        (
            "get_weather",
            {"city": "Paris", "country": "FR"},
            True,
            True,
            False,
            ["additional property", "'country' was unexpected"],
        ),
        ("get_weather", {"city": "Paris", "unit": "k"}, True, True, False, ["enum at $.unit"]),
        # jsonschema semantics kept: 3.0 is an integer from Draft 4 on (Ollama re-encodes it as 3 anyway).
        ("get_weather", {"city": "Paris", "days": 3.0}, True, True, True, []),
        (
            "get_weather",
            {"city": "Paris", "days": 3.5},
            True,
            True,
            False,
            ["wrong type at $.days", "not of type 'integer'"],
        ),
        ("get_weather", '{"city": "Paris"', True, True, False, ["arguments are not valid JSON"]),
        ("get_weather", '{"city": NaN}', True, True, False, ["not valid JSON", "NaN"]),
        ("get_weather", '["Paris"]', True, True, False, ["arguments must be a JSON object, not array"]),
        ("get_weather", "", True, True, False, ["missing required"]),  # "" means no arguments: {}
        ("get_weather", None, True, True, False, ["missing required"]),
        ("get_wether", {"city": "Paris"}, False, False, False, ["tool 'get_wether' was not offered"]),
        (None, {"city": "Paris"}, False, False, False, ["no tool name"]),
        ("no_params", {}, True, True, True, []),
        ("no_params", {"anything": 1}, True, True, True, []),
        ("broken_schema", {}, True, False, True, ["tool schema is invalid"]),
        ("string_schema", {}, True, False, True, ["tool schema must be an object"]),
        ("dangling_ref", {}, True, False, True, ["could not be applied"]),
        ("remote_ref", {}, True, False, True, ["could not be applied"]),  # never fetched
        # $schema honoured: Draft 4's boolean exclusiveMaximum applies...
        ("draft4", {"n": 10}, True, True, False, ["greater than or equal to the maximum of 10"]),
        ("draft4", {"n": 9}, True, True, True, []),
        # ...Draft 3 alone treats 3.0 as not an integer...
        ("draft3", {"n": 3.0}, True, True, False, ["wrong type at $.n"]),
        # ...and under the 2020-12 default the same boolean keyword makes the schema invalid.
        ("exclusive_bool_2020", {"n": 10}, True, False, True, ["tool schema is invalid"]),
    ],
)
def test_validate_call(name, arguments, offered, validated, valid, error_parts):
    result = validate_call(name, arguments, TOOLS)
    assert isinstance(result, Validation)
    assert (result.offered, result.validated, result.valid) == (offered, validated, valid), result.errors
    joined = " | ".join(result.errors)
    for part in error_parts:
        assert part in joined
    if valid and validated:
        assert result.errors == ()


def test_text_call_with_broken_arguments_is_invalid_via_raw_arguments():
    from toolproxy.calls import parse_text

    (call,) = parse_text('<tool_call>{"name": "get_weather", "arguments": {"city": "Par').calls
    assert call.arguments is None and call.error
    result = validate_call(call.name, call.raw_arguments, TOOLS)
    assert (result.offered, result.valid) == (True, False)
    assert "not valid JSON" in result.errors[0]


@pytest.mark.parametrize(
    "tools,expected",
    [
        (None, {}),
        ("not a list", {}),
        ([], {}),
        (
            [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}],
            {"a": {"type": "object"}},
        ),
        # Ollama /api/chat: same shape as OpenAI.
        ([{"type": "function", "function": {"name": "b", "description": "d", "parameters": {}}}], {"b": {}}),
        # Responses API / bare entries: name and parameters at the top level.
        ([{"type": "function", "name": "c", "parameters": {"type": "object"}}], {"c": {"type": "object"}}),
        ([{"name": "d", "parameters": {"type": "object"}}], {"d": {"type": "object"}}),
        ([{"name": "e"}], {"e": {}}),
        # Junk entries are skipped; the first of two same-named tools wins.
        (
            [
                1,
                None,
                {"function": {"description": "no name"}},
                {"name": 5},
                {"name": "f", "parameters": {"x": 1}},
                {"name": "f", "parameters": {"y": 2}},
            ],
            {"f": {"x": 1}},
        ),
    ],
)
def test_offered_tools(tools, expected):
    assert offered_tools(tools) == expected


@pytest.mark.parametrize(
    "raw,value,error_part",
    [
        ('{"a": 1}', {"a": 1}, None),
        (b'{"a": 1}', {"a": 1}, None),
        ({"a": 1}, {"a": 1}, None),
        ([1, 2], [1, 2], None),
        (None, {}, None),
        ("", {}, None),
        ("  \n", {}, None),
        ('{"a": 1', None, "not valid JSON"),
        ('{"a": 1} trailing', None, "Extra data"),
        ('{"a": Infinity}', None, "Infinity"),
        ('{"code": "a\nb"}', None, "Invalid control character"),
        (b"\xff\xfe", None, "not UTF-8"),
        ("[" * 100_000, None, "not valid JSON"),
    ],
)
def test_parse_arguments(raw, value, error_part):
    got, error = parse_arguments(raw)
    assert got == value
    if error_part is None:
        assert error is None
    else:
        assert error_part in error
