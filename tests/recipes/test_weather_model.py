"""The recipe checks' scripted model: fast table tests, so they run in the default suite too.

The slow checks trust it to do each harness's task right; if it did not, a broken harness recipe
and a broken scripted model would look alike.
"""

from __future__ import annotations

import jsonschema
import pytest
from weather import CHAT_TOOL, RESULT_PHRASE
from weather_model import ANSWER, example, respond

from toolproxy.emulators import ModelRequest

SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"}},
        "required": ["n", "x", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"],
    },
    {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer"}, "minItems": 1}},
        "required": ["xs"],
    },
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string"}}}, "required": ["xs"]},
    {
        "type": "object",
        "properties": {"p": {"type": "object", "properties": {"q": {"type": "integer"}}, "required": ["q"]}},
        "required": ["p"],
    },
    {"type": "object", "properties": {"opt": {"type": "string"}}},
    {"type": "object", "properties": {"v": {"type": ["integer", "null"]}}, "required": ["v"]},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_example_satisfies_the_schema(schema):
    jsonschema.validate(example(schema), schema)


def _request(tools: list[dict], messages: list[dict]) -> ModelRequest:
    body = {"model": "m", "messages": messages, "tools": tools}
    return ModelRequest(
        stack="llamacpp",
        path="/v1/chat/completions",
        model="m",
        body=body,
        messages=messages,
        tools=[t["function"]["name"] for t in tools],
        stream=False,
    )


def _tool(name: str, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


ASK = [{"role": "user", "content": "weather in Paris?"}]
DSPY_STEP = "[[ ## next_thought ## ]]\n{next_thought}\n\n[[ ## next_tool_name ## ]]\n{next_tool_name}"
AFTER_RESULT = ASK + [{"role": "tool", "tool_call_id": "1", "content": f"weather-service: {RESULT_PHRASE} in Paris"}]
CASES = [
    ("asks for the weather", [CHAT_TOOL], ASK, ("get_weather", {"city": "Paris"})),
    ("answers from the result", [CHAT_TOOL], AFTER_RESULT, ANSWER),
    (
        "smolagents ends through final_answer",
        [CHAT_TOOL, _tool("final_answer")],
        AFTER_RESULT,
        ("final_answer", {"answer": ANSWER}),
    ),
    (
        "mini-swe-agent: the shell must compute the phrase",
        [_tool("bash")],
        ASK,
        ("bash", {"command": 'echo "weather-service: sunny, $((20 + 2)) C in Paris"'}),
    ),
    (
        "mini-swe-agent submits after seeing it",
        [_tool("bash")],
        AFTER_RESULT,
        ("bash", {"command": f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo '{ANSWER}'"}),
    ),
    (
        "BFCL: the first offered function",
        [_tool("area", SCHEMAS[1]), _tool("other")],
        ASK,
        ("area", {"n": 1, "x": 1.5, "ok": True}),
    ),
    (
        "inspect-ai's react agent ends through submit",
        [CHAT_TOOL, _tool("submit")],
        AFTER_RESULT,
        ("submit", {"answer": ANSWER}),
    ),
    (
        "the city asked about",
        [CHAT_TOOL],
        [{"role": "user", "content": "What is the weather in Tokyo right now?"}],
        ("get_weather", {"city": "Tokyo"}),
    ),
    ("no tools: prose", [], ASK, ANSWER),
    (
        "dspy ReAct: a step chooses the tool in its fields",
        [],
        [{"role": "system", "content": DSPY_STEP}, *ASK],
        "[[ ## next_thought ## ]]\nI need the weather.\n\n[[ ## next_tool_name ## ]]\nget_weather\n\n"
        '[[ ## next_tool_args ## ]]\n{"city": "Paris"}\n\n[[ ## completed ## ]]\n',
    ),
    (
        "dspy ReAct: after the observation it finishes",
        [],
        [{"role": "system", "content": DSPY_STEP}, *AFTER_RESULT],
        "[[ ## next_thought ## ]]\nI have the weather.\n\n[[ ## next_tool_name ## ]]\nfinish\n\n"
        "[[ ## next_tool_args ## ]]\n{}\n\n[[ ## completed ## ]]\n",
    ),
    (
        "dspy ReAct: the extract step answers",
        [],
        [{"role": "system", "content": "[[ ## answer ## ]]\n{answer}"}, *AFTER_RESULT],
        f"[[ ## reasoning ## ]]\nThe tool said so.\n\n[[ ## answer ## ]]\n{ANSWER}\n\n[[ ## completed ## ]]\n",
    ),
]


@pytest.mark.parametrize("tools,messages,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_respond(tools, messages, expected):
    reply = respond(_request(tools, messages))
    if isinstance(expected, str):
        assert (reply.content, reply.calls) == (expected, ())
    else:
        ((call,),) = (reply.calls,)
        assert (call.name, call.arguments) == expected
