"""Turn roles and the metrics built on them, from real segment files through the real CLI.

Every episode below is one situation from a real harness (a correct call-then-answer, a call left
in text that the harness ignored or acted on, a retried refusal, an item that expects no call...)
written as the records the proxy writes; `toolproxy analyze` and `toolproxy report` run as a
user runs them and the table of expected roles and metrics is checked against what they stored
and printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import orjson
import pytest

from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.record.model import Record, encode_body, new_id

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
USER = {"role": "user", "content": "Weather in Oslo?"}
TEXT_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
CALL = ("call", '{"city":"Oslo"}')
BAD_CALL = ("call", '{"town":"Oslo"}')
REFUSED = {"error": {"message": "tools param requires --jinja flag", "type": "server_error", "code": 500}}


def assistant_call(args='{"city":"Oslo"}'):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}],
    }


TOOL_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "5C"}
# inspect-ai's react() offers its own submit tool beside the task's: its call is the answer
SUBMIT = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit an answer for evaluation.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}
# a tool that only shares the name
CRM_SUBMIT = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit the form to the CRM.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}
SUBMITTED = ("call", '{"answer":"5C"}', "submit")


def reply(spec) -> tuple[int, dict]:
    """(status, body) of a chat completion: "prose text", ("call", args), ("text", content), or an error."""
    if isinstance(spec, dict):
        return 500, spec
    message: dict = {"role": "assistant", "content": None}
    usage = {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32}
    if isinstance(spec, tuple) and spec[0] == "call":
        name = spec[2] if len(spec) > 2 else "get_weather"
        message["tool_calls"] = [{"id": "c1", "type": "function", "function": {"name": name, "arguments": spec[1]}}]
    elif isinstance(spec, tuple) and spec[0] == "swallowed":
        message["content"] = ""
    else:
        message["content"] = spec[1] if isinstance(spec, tuple) else spec
    return 200, {"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}


class Clock:
    def __init__(self):
        self.t = time.time() - 3600

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def record(clock, run, episode, messages, spec, *, tools=True, tags=None, item=None) -> Record:
    rec = Record(
        id=new_id(),
        started_at=clock(),
        run=run,
        episode=episode,
        item=item,
        method="POST",
        path="/v1/chat/completions",
        upstream="http://127.0.0.1:9",
        tags=tags or {},
    )
    body = {"model": "m", "messages": messages} | ({"tools": TOOLS if tools is True else tools} if tools else {})
    rec.request_body, rec.request_body_encoding = encode_body(orjson.dumps(body))
    status, payload = reply(spec)
    rec.status = rec.client_status = status
    rec.response_headers = [["content-type", "application/json"]]
    rec.response_body, rec.response_body_encoding = encode_body(orjson.dumps(payload))
    rec.response_complete = True
    return rec


# (episode, expected roles of its turns, expected delivered flags, records as (messages, reply, options))
EPISODES = [
    (
        "call-then-answer",
        ["call", "answer"],
        [True, False],
        [([USER], CALL, {}), ([USER, assistant_call(), TOOL_RESULT], "It is 5C in Oslo.", {})],
    ),
    ("no-tools-offered", ["no_tools"], [False], [([USER], "Hello.", {"tools": False})]),
    ("expects-none-and-abstains", ["abstain"], [False], [([USER], "No tool fits.", {"tags": {"expect": "none"}})]),
    ("expects-none-but-calls", ["abstain"], [True], [([USER], CALL, {"tags": {"expect": "none"}})]),
    ("prose-nobody-can-judge", ["open"], [False], [([USER], "It is probably cold.", {})]),
    ("expects-call-gets-prose", ["call"], [False], [([USER], "It is probably cold.", {"tags": {"expect": "call"}})]),
    (
        "nudged-after-prose",
        ["call", "call", "answer"],
        [False, True, False],
        [
            ([USER], "Let me think.", {}),
            (
                [USER, {"role": "assistant", "content": "Let me think."}, {"role": "user", "content": "Use the tool."}],
                CALL,
                {},
            ),
            (
                [
                    USER,
                    {"role": "assistant", "content": "Let me think."},
                    {"role": "user", "content": "Use the tool."},
                    assistant_call(),
                    TOOL_RESULT,
                ],
                "5C.",
                {},
            ),
        ],
    ),
    ("text-call-ignored", ["call"], [False], [([USER], ("text", TEXT_CALL), {})]),
    (
        "text-call-acted-on",
        ["call", "answer"],
        [True, False],
        [
            ([USER], ("text", TEXT_CALL), {}),
            (
                [USER, {"role": "assistant", "content": TEXT_CALL}, {"role": "user", "content": "Observation: 5C"}],
                "5C.",
                {},
            ),
        ],
    ),
    (
        "invalid-then-valid",
        ["call", "call", "answer"],
        [False, True, False],
        [
            ([USER], BAD_CALL, {}),
            (
                [USER, assistant_call('{"town":"Oslo"}'), {"role": "tool", "tool_call_id": "c1", "content": "error"}],
                CALL,
                {},
            ),
            (
                [
                    USER,
                    assistant_call('{"town":"Oslo"}'),
                    {"role": "tool", "tool_call_id": "c1", "content": "error"},
                    assistant_call(),
                    TOOL_RESULT,
                ],
                "5C.",
                {},
            ),
        ],
    ),
    ("refused-three-times", [None], [False], [([USER], REFUSED, {})] * 3),
    ("swallowed", [None], [False], [([USER], ("swallowed",), {})]),
    (
        "irrelevance-untagged",
        ["open"],
        [False],
        [([USER], "I cannot help with that.", {"tags": {"category": "irrelevance"}})],
    ),
]
# A harness with a finishing tool of its own, in a run of their own (the run above is worked by hand below).
FINISHING = [
    (
        "call-then-submit",
        ["call", "answer"],
        [True, True],
        [
            ([USER], CALL, {"tools": [*TOOLS, SUBMIT]}),
            ([USER, assistant_call(), TOOL_RESULT], SUBMITTED, {"tools": [*TOOLS, SUBMIT]}),
        ],
    ),
    # where the harness ends only by its submit tool, prose ends nothing: the due call was not made
    (
        "call-then-prose-where-the-harness-submits",
        ["call", "call"],
        [True, False],
        [
            ([USER], CALL, {"tools": [*TOOLS, SUBMIT]}),
            ([USER, assistant_call(), TOOL_RESULT], "It is 5C.", {"tools": [*TOOLS, SUBMIT]}),
        ],
    ),
    (
        "call-then-an-unrelated-submit-tool",
        ["call", "call"],
        [True, True],
        [
            ([USER], CALL, {"tools": [*TOOLS, CRM_SUBMIT]}),
            ([USER, assistant_call(), TOOL_RESULT], SUBMITTED, {"tools": [*TOOLS, CRM_SUBMIT]}),
        ],
    ),
]


# (item, its turns as (messages, reply)): every turn is an `abstain` turn.
IRRELEVANCE = [
    ("declines", [([USER], "None of my tools can answer that.")]),
    # llama.cpp without a parser for the model's format: the call stays in the text the harness got
    ("text-call-ignored", [([USER], ("text", TEXT_CALL))]),
    (
        "text-call-broken",
        [([USER], ("text", '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'))],
    ),
    ("structured-call", [([USER], CALL)]),
    ("structured-bad-call", [([USER], BAD_CALL)]),
    # a text-protocol harness parsed the call itself and sent its result back: it reached the harness
    (
        "text-call-acted-on",
        [
            ([USER], ("text", TEXT_CALL)),
            (
                [USER, {"role": "assistant", "content": TEXT_CALL}, {"role": "user", "content": "Observation: 5C"}],
                "5C.",
            ),
        ],
    ),
]


def write_segment(data: Path, records) -> None:
    seg = data / "segments"
    seg.mkdir(parents=True, exist_ok=True)
    with open(seg / "s1.jsonl", "ab") as f:
        for r in records:
            f.write(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE))


def toolproxy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolproxy.cli", *args], capture_output=True, text=True, timeout=300)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def build(data: Path) -> None:
    clock = Clock()
    recs = []
    for run, episodes in (("roles", EPISODES), ("finishing", FINISHING)):
        for name, _, _, turns in episodes:
            for messages, spec, opts in turns:
                recs.append(record(clock, run, name, messages, spec, **opts))
    # Three episodes that all fail: the interval must not read "0% [0-0]".
    for i in range(3):
        recs.append(record(clock, "fails", str(i), [USER], BAD_CALL))
    # Items that expect no call, answered the ways a real stack answers them; and the same items declined.
    for name, turns in IRRELEVANCE:
        for messages, spec in turns:
            recs.append(record(clock, "irrelevance", name, messages, spec, tags={"expect": "none"}, item=name))
        recs.append(
            record(clock, "irrelevance-declined", name, [USER], "No tool fits.", tags={"expect": "none"}, item=name)
        )
    write_segment(data, recs)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    data = tmp_path_factory.mktemp("roles")
    build(data)
    out = ok(toolproxy("analyze", "--data", str(data)))
    assert f"analyzer version {ANALYZER_VERSION}" in out
    return data


def query(data: Path, sql: str, params=()) -> list[tuple]:
    con = duckdb.connect(str(data / "toolproxy.duckdb"), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def report_json(data: Path, *args: str) -> dict:
    doc = json.loads(ok(toolproxy("report", "--data", str(data), "--format", "json", *args)))
    return doc


@pytest.mark.parametrize(
    "run,name,roles,delivered",
    [("roles", *e[:3]) for e in EPISODES] + [("finishing", *e[:3]) for e in FINISHING],
    ids=[e[0] for e in EPISODES + FINISHING],
)
def test_role_and_delivery_of_every_turn(store, run, name, roles, delivered):
    rows = query(
        store,
        "select role, delivered, analyzer_version from turns where episode_key = ? order by turn_index",
        [f"{run}/{name}"],
    )
    assert [r[0] for r in rows] == roles
    assert [r[1] for r in rows] == delivered
    assert {r[2] for r in rows} == {ANALYZER_VERSION}


def test_a_retried_refusal_keeps_its_cause_and_the_model_ran_but_said_nothing_is_swallowed(store):
    rows = query(store, "select episode_key, sub_kind, n_attempts from turns where outcome = 'non_response' order by 1")
    assert rows == [("roles/refused-three-times", "refused", 3), ("roles/swallowed", "swallowed", 1)]
    text = ok(toolproxy("report", "--data", str(store), "--run", "roles"))
    assert "refused 1 (after 2 retries)" in " ".join(text.split())
    assert "retry_exhausted" not in text


# The run's numbers, worked by hand from the table above:
#   call turns 8: call-then-answer 1, expects-call-gets-prose 1, nudged 2, text-call-ignored 1,
#     text-call-acted-on 1, invalid-then-valid 2; valid among them 5, delivered 4 (not the ignored text call)
#   answer episodes 4 of the 8 that had a call, answer or open turn; restraint 1 of 2 abstain turns
#   paper fidelity: 6 valid calls (the abstain item's call included) of 17 produced turns
def test_report_json_carries_every_metric_worked_by_hand(store):
    doc = report_json(store)
    assert doc["analyzer_version"] == ANALYZER_VERSION
    runs = {r["run"]: r for r in doc["runs"]}
    r = runs["roles"]
    for metric in ("call_fidelity", "delivered_fidelity", "restraint", "answer_rate", "paper_fidelity"):
        assert {
            "pooled",
            "episode_mean",
            "ci_low",
            "ci_high",
            "numerator",
            "denominator",
            "wilson_low",
            "wilson_high",
            "episodes_rated",
            "interval_note",
        } <= set(r[metric]), metric
    assert r["roles"] == {"call": 8, "answer": 4, "abstain": 2, "open": 2, "no_tools": 1}
    assert (r["call_fidelity"]["numerator"], r["call_fidelity"]["denominator"]) == (5, 8)
    assert (r["delivered_fidelity"]["numerator"], r["delivered_fidelity"]["denominator"]) == (4, 8)
    assert r["lost_in_serving"] == pytest.approx(1 / 8)
    assert (r["restraint"]["numerator"], r["restraint"]["denominator"]) == (1, 2)
    assert (r["answer_rate"]["numerator"], r["answer_rate"]["denominator"]) == (4, 8)
    assert (r["paper_fidelity"]["numerator"], r["paper_fidelity"]["denominator"]) == (6, 17)
    assert r["non_response_kinds"] == {"refused": 1, "swallowed": 1}
    assert r["non_response_retries"] == {"refused": 2}


def test_delivered_restraint_counts_what_reached_the_harness_restraint_what_the_model_tried(store):
    """Seven abstain turns: the model declined in two (restraint 2/7), but only three calls reached
    the harness (two in tool_calls, one text call the harness acted on), so it saw restraint in
    four (delivered restraint 4/7): calls left in the text, parseable or broken, never reached it.
    compare's delivered verdict reads the same per-turn answer, item by item."""
    assert query(
        store,
        "select episode_key, outcome, role, delivered from turns where run = 'irrelevance' "
        "order by episode_key, turn_index",
    ) == [
        ("irrelevance/declines", "prose", "abstain", False),
        ("irrelevance/structured-bad-call", "invalid_args", "abstain", False),
        ("irrelevance/structured-call", "valid_call", "abstain", True),
        ("irrelevance/text-call-acted-on", "valid_call", "abstain", True),
        ("irrelevance/text-call-acted-on", "prose", "abstain", False),
        ("irrelevance/text-call-broken", "invalid_args", "abstain", False),
        ("irrelevance/text-call-ignored", "valid_call", "abstain", False),
    ]
    runs = {r["run"]: r for r in report_json(store)["runs"]}
    r = runs["irrelevance"]
    assert (r["restraint"]["numerator"], r["restraint"]["denominator"]) == (2, 7)
    d = r["delivered_restraint"]
    assert (d["numerator"], d["denominator"], d["pooled"]) == (4, 7, pytest.approx(4 / 7))
    assert d["wilson_low"] == pytest.approx(0.2504, abs=1e-4) and d["wilson_high"] == pytest.approx(0.8418, abs=1e-4)
    assert d["episode_mean"] == pytest.approx(3.5 / 6) and d["interval_note"] is None and d["ci_low"] < d["ci_high"]
    declined = runs["irrelevance-declined"]
    assert declined["restraint"]["pooled"] == declined["delivered_restraint"]["pooled"] == 1.0
    # no item here expects a call: neither restraint is defined for a run without abstain turns
    assert runs["roles"]["delivered_restraint"]["denominator"] == runs["roles"]["restraint"]["denominator"] == 2
    assert runs["fails"]["delivered_restraint"]["pooled"] is None
    table = " ".join(ok(toolproxy("report", "--data", str(store), "--run", "irrelevance")).split())
    assert "29% 57%" in table  # restraint, then delivered restraint, side by side
    assert (
        "calls kept from the harness on items expecting none: 2 of 7 turns of items expecting no call attempted "
        "a call that never reached the harness"
    ) in table
    markdown = ok(toolproxy("report", "--data", str(store), "--run", "irrelevance", "--format", "markdown"))
    assert "| restraint [95% CI] | delivered restraint [95% CI] |" in markdown
    assert "| 28.6% [8.2-64.1] | 57.1% [25.0-84.2] |" in markdown
    page = ok(toolproxy("report", "--data", str(store), "--run", "irrelevance", "--format", "html"))
    assert "Delivered restraint per run" in page and "irrelevance: 57.1% [25.0-84.2]" in page
    doc = json.loads(
        ok(toolproxy("compare", "irrelevance", "irrelevance-declined", "--data", str(store), "--format", "json"))
    )
    o = doc["overall"]
    assert (o["paired"], o["both_pass"], o["a_only"], o["b_only"]) == (6, 3, 0, 3)
    doc = json.loads(
        ok(
            toolproxy(
                "compare",
                "irrelevance",
                "irrelevance-declined",
                "--data",
                str(store),
                "--format",
                "json",
                "--metric",
                "call",
            )
        )
    )
    assert (doc["overall"]["both_pass"], doc["overall"]["b_only"]) == (1, 5)


def test_a_correct_call_then_answer_agent_scores_full_marks(tmp_path):
    """Eight real harnesses' correct episodes read 50% when the final answer counted as a missed call."""
    clock = Clock()
    recs = []
    for i in range(5):
        recs.append(record(clock, "correct", str(i), [USER], CALL))
        recs.append(record(clock, "correct", str(i), [USER, assistant_call(), TOOL_RESULT], "It is 5C in Oslo."))
    data = tmp_path / "correct"
    write_segment(data, recs)
    ok(toolproxy("analyze", "--data", str(data)))
    r = report_json(data)["runs"][0]
    for metric in ("call_fidelity", "delivered_fidelity", "answer_rate"):
        assert r[metric]["pooled"] == 1.0 and r[metric]["episode_mean"] == 1.0, metric
        assert r[metric]["interval_note"] == "every episode scored the same"
    assert r["paper_fidelity"]["pooled"] == 0.5  # the original study's definition, kept and labelled
    table = ok(toolproxy("report", "--data", str(data)))
    assert "100% [57-100]" in table and "(original study's definition)" not in table.split("\n")[2]


def test_three_failing_episodes_never_read_zero_to_zero(store):
    fails = {r["run"]: r for r in report_json(store)["runs"]}["fails"]
    c = fails["call_fidelity"]
    assert c["pooled"] == 0.0 and c["wilson_low"] == 0.0 and c["wilson_high"] > 0.5
    assert c["ci_low"] is None and c["interval_note"] == "too few episodes"
    table = ok(toolproxy("report", "--data", str(store), "--run", "fails"))
    assert "0% [0-56]" in table and "[0-0]" not in table
    assert "0% (3/3 eps)" in table  # the per-episode mean, with the episodes it is over


def test_expectation_rules_at_report_time_and_at_analysis_time(store, tmp_path):
    rule = "category=irrelevance:none"
    base = {r["run"]: r for r in report_json(store)["runs"]}["roles"]["roles"]
    assert base["open"] == 2
    # report time: the irrelevance item becomes an abstain scored by restraint, nothing stored changes
    doc = report_json(store, "--expect", rule)
    assert doc["expect_rules"] == [rule]
    roles = {r["run"]: r for r in doc["runs"]}["roles"]
    assert roles["roles"]["open"] == 1 and roles["roles"]["abstain"] == 3
    assert (roles["restraint"]["numerator"], roles["restraint"]["denominator"]) == (2, 3)
    assert query(store, "select role from turns where episode_key = 'roles/irrelevance-untagged'") == [("open",)]
    # a rule overrides an expect tag; the last matching rule wins
    doc = report_json(store, "--expect", "episode=expects-none-*:call", "--expect", "episode=expects-none-but-*:none")
    roles = {r["run"]: r for r in doc["runs"]}["roles"]["roles"]
    assert roles["abstain"] == 1 and roles["call"] == 9
    # analysis time: stored, so a plain report and a later incremental analyze keep using it
    data = tmp_path / "copy"
    build(data)
    out = ok(toolproxy("analyze", "--data", str(data), "--expect", rule))
    assert query(data, "select role, expect from turns where episode_key = 'roles/irrelevance-untagged'") == [
        ("abstain", "none")
    ]
    assert "rebuilt" not in out
    out = ok(toolproxy("analyze", "--data", str(data)))
    assert "rebuilt" not in out
    assert query(data, "select role from turns where episode_key = 'roles/irrelevance-untagged'") == [("abstain",)]
    out = ok(toolproxy("analyze", "--data", str(data), "--clear-expect"))
    assert "rebuilt derived tables (expectation rules changed)" in out
    assert query(data, "select role from turns where episode_key = 'roles/irrelevance-untagged'") == [("open",)]


@pytest.mark.parametrize(
    "bad,message",
    [
        ("category=irrelevance", "write TAG=VALUE:EXPECT"),
        ("category=irrelevance:maybe", "must end in :call or :none"),
        ("=x:none", "write TAG=VALUE:EXPECT"),
    ],
)
def test_a_mistyped_rule_is_a_usage_error(store, bad, message):
    for cmd in (["report"], ["analyze"], ["compare", "roles", "fails"]):
        proc = toolproxy(*cmd, "--data", str(store), "--expect", bad)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, (cmd, proc.stderr)


DERIVED = {
    "turns": "select * exclude (content) from turns order by turn_id",
    "episodes": "select * from episodes order by episode_key",
    "runs": "select * exclude (first_seen, last_seen) from runs order by run",
    "calls": "select * from calls order by exchange_id, idx",
    "exchanges": "select id, outcome, sub_kind, surface, n_calls, harness_saw_prose, state_hash, chain_hash, "
    "parent_hashes, item_hash, call_signature, tool_results, turn_id, analyzer_version, record "
    "from exchanges order by id",
}


def snapshot(data: Path) -> dict:
    return {table: query(data, sql) for table, sql in DERIVED.items()}


def test_reclassify_is_idempotent_and_rebuilds_from_the_raw_exchanges(tmp_path):
    data = tmp_path / "d"
    build(data)
    ok(toolproxy("analyze", "--data", str(data)))
    first = snapshot(data)
    out = ok(toolproxy("analyze", "--data", str(data), "--reclassify"))
    assert "rebuilt derived tables (--reclassify)" in out and "new exchanges: 0" in out
    assert snapshot(data) == first
    ok(toolproxy("analyze", "--data", str(data), "--reclassify"))
    assert snapshot(data) == first
    # A store derived by an older analyzer, with its old verdicts: the next plain analyze rebuilds
    # every derived row from the raw bodies, and no row keeps the old version.
    con = duckdb.connect(str(data / "toolproxy.duckdb"))
    con.execute("update analyzer_state set value = '1' where key = 'analyzer_version'")
    con.execute("update exchanges set outcome = 'prose', analyzer_version = 1, tool_results = null")
    con.execute("update turns set role = 'open', analyzer_version = 1")
    con.execute("delete from calls")
    con.close()
    stale = " ".join(ok(toolproxy("report", "--data", str(data))).split())
    assert (
        f"analyzer v1 (this toolproxy's analyzer is v{ANALYZER_VERSION}: run `toolproxy analyze` to rebuild)" in stale
    )
    out = ok(toolproxy("analyze", "--data", str(data)))
    assert f"rebuilt derived tables (analyzer version 1 -> {ANALYZER_VERSION})" in out
    assert snapshot(data) == first
    assert query(
        data,
        "select distinct analyzer_version from turns union select distinct analyzer_version from exchanges "
        "union select distinct analyzer_version from calls",
    ) == [(ANALYZER_VERSION,)]
    out = ok(toolproxy("analyze", "--data", str(data)))
    assert "rebuilt" not in out


def test_compare_defaults_to_delivered_and_counts_a_call_left_in_text_as_a_miss(tmp_path):
    """Two arms over the same items: A's calls reach the harness, B's sit in the reply text."""
    clock = Clock()
    recs = []
    for i in range(4):
        item = f"simple_{i}"
        recs.append(record(clock, "structured", item, [USER], CALL, item=item))
        recs.append(record(clock, "in-text", item, [USER], ("text", TEXT_CALL), item=item))
    data = tmp_path / "cmp"
    write_segment(data, recs)
    ok(toolproxy("analyze", "--data", str(data)))
    doc = json.loads(ok(toolproxy("compare", "structured", "in-text", "--data", str(data), "--format", "json")))
    assert doc["metric"] == "delivered" and set(doc) >= {"overall", "categories"}
    o = doc["overall"]
    assert (o["paired"], o["both_pass"], o["a_only"], o["b_only"], o["both_fail"]) == (4, 0, 4, 0, 0)
    doc = json.loads(
        ok(toolproxy("compare", "structured", "in-text", "--data", str(data), "--format", "json", "--metric", "call"))
    )
    assert (doc["overall"]["both_pass"], doc["overall"]["a_only"]) == (4, 0)
