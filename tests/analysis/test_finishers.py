"""A harness's own finishing tool, told apart from a tool that only shares its name, and the role
rules that read it: one definition (analysis.episodes.roles.RULES) read as SQL and in Python, equal on
every combination of the columns it reads, NULLs included."""

from __future__ import annotations

import itertools
import re

import duckdb
import pytest

from toolproxy.analysis.classify.harnesses import finisher, finishes
from toolproxy.analysis.episodes.roles import COLUMNS, ROLE_SQL, role_of


def chat_tool(name: str, description: str | None, **params: str) -> dict:
    fn = {"name": name, "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in params.items()}}}
    if description is not None:
        fn["description"] = description
    return {"type": "function", "function": fn}


# the tools as each harness sends them (tests/data/episodes, the truth rig's recordings)
SMOL = chat_tool("final_answer", "Provides a final answer to the given problem.", answer="string")
SUBMIT = chat_tool("submit", "Submit an answer for evaluation.", answer="string")
BASH = chat_tool("bash", "Execute a bash command", command="string")
MINI_PROMPT = [
    {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
    {
        "role": "user",
        "content": "Please solve this issue: X\n... issuing the following command: "
        "`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.",
    },
]
WEATHER = chat_tool("get_weather", "Current weather for a city.", city="string")
RESPONSES_SUBMIT = {
    "type": "function",
    "name": "submit",
    "description": "Submit an answer for evaluation.",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
}

# (case, protocol, tools, messages, the harness whose finisher it is, or None)
OFFERED = [
    ("smolagents ToolCallingAgent", None, [WEATHER, SMOL], [], "smolagents ToolCallingAgent"),
    ("inspect-ai react", None, [WEATHER, SUBMIT], [], "inspect-ai react"),
    ("inspect-ai on Responses (flat tools)", None, [WEATHER, RESPONSES_SUBMIT], [], "inspect-ai react"),
    ("mini-swe-agent", None, [BASH], MINI_PROMPT, "mini-swe-agent"),
    ("a bash tool without mini-swe-agent's prompt", None, [BASH], MINI_PROMPT[:1], None),
    (
        "an unrelated tool named submit",
        None,
        [chat_tool("submit", "Submit a form to the CRM.", form="object")],
        [],
        None,
    ),
    ("a submit tool without a description", None, [chat_tool("submit", None, answer="string")], [], None),
    ("final_answer described otherwise", None, [chat_tool("final_answer", "Say the answer aloud.")], [], None),
    ("smolagents' tool under another protocol", "react", [SMOL], [], None),
    (
        "dspy's finish under dspy",
        "dspy",
        [chat_tool("finish", "Marks the task as complete. That is, ...")],
        [],
        "dspy ReAct",
    ),
    (
        "a finish tool in a tools field",
        None,
        [chat_tool("finish", "Marks the task as complete. That is, ...")],
        [],
        None,
    ),
    ("no tools", None, [], [], None),
    ("tools that are not objects", None, ["submit", None, {"function": "x"}], [], None),
]


@pytest.mark.parametrize("protocol,tools,messages,harness", [c[1:] for c in OFFERED], ids=[c[0] for c in OFFERED])
def test_a_finishing_tool_is_known_by_its_name_and_how_its_harness_describes_it(protocol, tools, messages, harness):
    found = finisher(protocol, tools, messages)
    assert (found.harness if found else None) == harness


SMOL_F = finisher(None, [SMOL])
INSPECT_F = finisher(None, [SUBMIT])
MINI_F = finisher(None, [BASH], MINI_PROMPT)
DSPY_F = finisher("dspy", [chat_tool("finish", "Marks the task as complete.")])
# (case, finisher, calls, the calls were left in the reply text, finishes)
CALLS = [
    ("smolagents' final_answer", SMOL_F, [("final_answer", {"answer": "5C"})], False, True),
    ("smolagents parses a final_answer left in text itself", SMOL_F, [("final_answer", {"answer": "5C"})], True, True),
    (
        "final_answer beside another call",
        SMOL_F,
        [("final_answer", {}), ("get_weather", {"city": "Oslo"})],
        False,
        False,
    ),
    ("inspect-ai's submit", INSPECT_F, [("submit", {"answer": "5C"})], False, True),
    ("a submit left in text never reached inspect-ai", INSPECT_F, [("submit", {"answer": "5C"})], True, False),
    (
        "mini-swe-agent's submit command",
        MINI_F,
        [("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})],
        False,
        True,
    ),
    (
        "the marker quoted, with a submission after it",
        MINI_F,
        [("bash", {"command": "  echo 'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT'; echo done"})],
        False,
        True,
    ),
    ("another command", MINI_F, [("bash", {"command": "ls -la"})], False, False),
    (
        "a longer word than the marker",
        MINI_F,
        [("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUTS"})],
        False,
        False,
    ),
    (
        "the marker not first",
        MINI_F,
        [("bash", {"command": "ls; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})],
        False,
        False,
    ),
    (
        "arguments that are not an object",
        MINI_F,
        [("bash", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")],
        False,
        False,
    ),
    (
        "a submit command left in text",
        MINI_F,
        [("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})],
        True,
        False,
    ),
    ("dspy's finish, written in its fields", DSPY_F, [("finish", {})], True, True),
    ("no finisher offered", None, [("submit", {"answer": "5C"})], False, False),
    ("no call", INSPECT_F, [], False, False),
]


@pytest.mark.parametrize("f,calls,in_text,want", [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_a_reply_finishes_only_by_the_finishing_call_as_the_harness_received_it(f, calls, in_text, want):
    assert finishes(f, calls, in_text) is want


VALUES = {
    "outcome": ["non_response", "prose", "valid_call", "invalid_args", None],
    "offered_tools": [True, False, None],
    "expect": ["call", "none", None],
    "rejected": [True, False, None],
    "last_with_tools": [True, False, None],
    "is_last": [True, False],
    "finishes": [True, False, None],
    "finisher": ["inspect-ai react", None],
    "saw_result": [True, False, None],
}


def _literal(value) -> str:
    return "NULL" if value is None else str(value).lower() if isinstance(value, bool) else f"'{value}'"


def test_the_role_rules_read_the_same_in_sql_and_in_python():
    assert set(VALUES) == set(COLUMNS)
    lists = [f"(SELECT unnest([{', '.join(map(_literal, values))}]) AS {name})" for name, values in VALUES.items()]
    con = duckdb.connect()
    rows = con.execute(f"SELECT {ROLE_SQL} AS role, * FROM {' CROSS JOIN '.join(lists)}").fetchall()
    names = list(VALUES)
    assert len(rows) == len(list(itertools.product(*VALUES.values())))
    assert [r[0] for r in rows] == [role_of(dict(zip(names, r[1:]))) for r in rows]
    assert {r[0] for r in rows} == {None, "no_tools", "abstain", "call", "answer", "open"}  # every rule was reached


# (case, columns beside a produced, offered, unexpected turn ending its episode after a tool result, role)
ENDINGS = [
    ("prose, no finisher offered", {"outcome": "prose"}, "answer"),
    ("prose where the harness ends by its finishing tool", {"outcome": "prose", "finisher": "mini-swe-agent"}, "call"),
    ("the finishing call", {"outcome": "valid_call", "finishes": True, "finisher": "inspect-ai react"}, "answer"),
    ("another call", {"outcome": "valid_call", "finisher": "inspect-ai react"}, "call"),
    (
        "the finishing call, then a turn the harness nudged",
        {"outcome": "valid_call", "finishes": True, "finisher": "inspect-ai react", "last_with_tools": False},
        "call",
    ),
    ("the finishing call the harness rejected", {"outcome": "valid_call", "finishes": True, "rejected": True}, "call"),
    (
        "the finishing call before any tool result",
        {"outcome": "valid_call", "finishes": True, "saw_result": False},
        "open",
    ),
]


@pytest.mark.parametrize("columns,role", [c[1:] for c in ENDINGS], ids=[c[0] for c in ENDINGS])
def test_where_a_harness_has_a_finishing_tool_only_its_call_answers(columns, role):
    base = {"offered_tools": True, "last_with_tools": True, "is_last": True, "saw_result": True, "rejected": False}
    assert role_of(base | columns) == role


def test_role_sql_names_only_the_columns_it_says_it_reads():
    words = set(re.findall(r"\b[a-z_]+\b", ROLE_SQL)) - {"coalesce", "false", "true"}
    assert words - {"non_response", "no_tools", "none", "abstain", "call", "prose", "answer", "open"} == set(COLUMNS)
