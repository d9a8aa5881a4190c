"""The conformance cases (the conformance gate's base cases plus the ones users hit): a request and a pure pass check.

Each case is judged on what the harness received (native `tool_calls` and content), because that
is what an agent acts on. One exception: inventing a tool is the model's fault whatever the
surface, so `missing_tool` also looks for invented names in calls left as text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolproxy.checks.doctor import TOOL_MESSAGES, WEATHER_TOOL
from toolproxy.checks.reply import ProbeReply, call_problems


def _tool(name: str, description: str, properties: dict, required: list[str], **extra: Any) -> dict:
    params = {"type": "object", "properties": properties, "required": required, **extra}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


SEARCH_FLIGHTS = _tool(
    "search_flights",
    "Search flights between two cities.",
    {"origin": {"type": "string"}, "destination": {"type": "string"}},
    ["origin", "destination"],
    additionalProperties=False,
)
THERMOSTAT = _tool(
    "set_thermostat_mode",
    "Switch the thermostat mode.",
    {"mode": {"type": "string", "enum": ["heat", "cool", "off"]}},
    ["mode"],
)
TIMER = _tool("set_timer", "Start a countdown timer.", {"minutes": {"type": "integer", "minimum": 1}}, ["minutes"])
CREATE_EVENT = _tool(
    "create_event",
    "Create a calendar event.",
    {
        "title": {"type": "string"},
        "location": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
        },
    },
    ["title", "location"],
)
SYSTEM = TOOL_MESSAGES[0]  # the system prompt doctor's probe uses: one wording to keep in step


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    description: str
    tools: list[dict]
    messages: list[dict]
    check: Callable[[ProbeReply, list[dict]], tuple[bool, str]]


def _user(text: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": text}]


def _no_calls(reply: ProbeReply, tools: list[dict]) -> tuple[bool, str]:
    if reply.calls:
        return False, f"called {', '.join(str(c.name) for c in reply.calls)} though no tool was needed"
    if not reply.content.strip():
        return False, "empty answer"
    return True, "answered without a call"


def _nothing_invented(reply: ProbeReply, tools: list[dict]) -> tuple[bool, str]:
    offered = {t["function"]["name"] for t in tools}
    names = [c.name for c in reply.calls] + [c.name for c in reply.text_calls(tools).calls]
    invented = [n for n in names if n not in offered]
    if invented:
        return False, f"invented tool {invented[0]!r}"
    if not reply.calls and not reply.content.strip():
        return False, "empty answer"
    return True, "no tool invented"


def _valid_call_to(name: str, extra: Callable[[dict], str | None] | None = None):
    def check(reply: ProbeReply, tools: list[dict]) -> tuple[bool, str]:
        calls = [c for c in reply.calls if c.name == name]
        if not calls:
            if reply.calls:
                return False, f"no call to {name} (called {reply.calls[0].name})"
            if any(c.name == name for c in reply.text_calls(tools).calls):
                return False, f"the call to {name} was left as text in content (the stack did not extract it)"
            return False, f"no call to {name}"
        problems = call_problems(calls[0], tools)
        if problems:
            return False, problems[0]
        why = extra(calls[0].arguments_object()) if extra is not None else None
        return (why is None), why or "valid call"

    return check


def _only_declared(args: dict) -> str | None:
    extra = sorted(set(args) - {"origin", "destination"})
    return f"extra properties {extra}" if extra else None


def _heat(args: dict) -> str | None:
    return None if args.get("mode") == "heat" else f"mode {args.get('mode')!r}, expected 'heat'"


def _integer_three(args: dict) -> str | None:
    v = args.get("minutes")
    if type(v) is not int:
        return f"minutes is {v!r} ({type(v).__name__}), not the integer 3"
    return None if v == 3 else f"minutes is {v}, expected 3"


def _berlin(args: dict) -> str | None:
    loc = args.get("location") or {}
    return None if "berlin" in str(loc.get("city", "")).lower() else f"location {loc!r}"


def _two_cities(reply: ProbeReply, tools: list[dict]) -> tuple[bool, str]:
    args = [c.arguments_object() for c in reply.calls if c.name == "get_weather"]
    cities = {str(a.get("city", "")).lower() for a in args if isinstance(a, dict)}
    missing = [c for c in ("paris", "london") if not any(c in got for got in cities)]
    return (not missing), ("both cities requested" if not missing else f"no call for {', '.join(missing)}")


def _answers_from_result(reply: ProbeReply, tools: list[dict]) -> tuple[bool, str]:
    if reply.calls:
        return False, f"called {reply.calls[0].name} again instead of answering"
    if "18" not in reply.content:
        return False, "final answer does not use the tool result (18 °C)"
    return True, "answered from the tool result"


TOOL_RESULT_MESSAGES = [
    SYSTEM,
    {"role": "user", "content": "What is the weather in Paris right now?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 18, "conditions": "sunny"}'},
]

CASES = (
    Case(
        "no_tool_needed",
        "a question no tool helps with: answer, 0 calls",
        [WEATHER_TOOL],
        _user("What is 12 + 30? ProbeReply with the number only."),
        _no_calls,
    ),
    Case(
        "missing_tool",
        "the fitting tool is not offered: do not invent one",
        [WEATHER_TOOL],
        _user("Book a table for two at an Italian restaurant tonight at 8pm."),
        _nothing_invented,
    ),
    Case(
        "required_argument",
        "the required argument is present and typed",
        [WEATHER_TOOL],
        _user("What is the weather in Tokyo right now?"),
        _valid_call_to("get_weather"),
    ),
    Case(
        "no_extra_properties",
        "no argument beyond the schema's (additionalProperties: false)",
        [SEARCH_FLIGHTS],
        _user("Find me flights from Paris to Rome on May 3rd, economy class."),
        _valid_call_to("search_flights", _only_declared),
    ),
    Case(
        "two_targets",
        "two cities asked: a call for each (batching is a policy)",
        [WEATHER_TOOL],
        _user("What is the weather in Paris and in London right now?"),
        _two_cities,
    ),
    Case(
        "enum_value",
        "an enum argument takes one of its values",
        [THERMOSTAT],
        _user("It is freezing in here, warm the room up."),
        _valid_call_to("set_thermostat_mode", _heat),
    ),
    Case(
        "integer_argument",
        'an integer argument is sent as 3, not 3.0 or "3"',
        [TIMER],
        _user("Set a timer for 3 minutes."),
        _valid_call_to("set_timer", _integer_three),
    ),
    Case(
        "nested_object",
        "an object argument with its own required fields",
        [CREATE_EVENT],
        _user("Create an event called 'Launch party' in Berlin, Germany."),
        _valid_call_to("create_event", _berlin),
    ),
    Case(
        "tool_result_answer",
        "after a tool result, a final answer that uses it (no new call)",
        [WEATHER_TOOL],
        TOOL_RESULT_MESSAGES,
        _answers_from_result,
    ),
)
BY_NAME = {c.name: c for c in CASES}
