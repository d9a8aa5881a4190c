"""Episodes, roles, delivered calls and answers of real harnesses, against their own record.

Each case in tests/data/episodes is one run of a real package (its version in harness.json) through
`toolproxy serve`, untagged, with the harness's own account of what it did beside it: a line per
real tool execution, its answers, its steps. `toolproxy analyze` runs on the proxy's unedited
segments and what it concludes is checked turn by turn, and against that account: as many
episodes as the harness ran, as many delivered calls as it executed, as many answers as it got
(where the two may differ, the case says why).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import captured
import pytest

DATA = Path(__file__).resolve().parent.parent / "data" / "episodes"
STOPPED = "Agent stopped due to iteration limit or time limit."


@dataclass(frozen=True)
class Case:
    path: str
    # Per episode (in the order of their first requests), per turn: outcome, role, delivered, protocol.
    episodes: list
    answers: int  # episodes ending in an `answer` turn
    why: str = ""  # why that differs from the episodes the harness itself counts as answered


CALL, ANSWER = ("valid_call", "call", True, None), ("prose", "answer", False, None)
TEXT_CALL = ("valid_call", "call", False, None)  # a call the stack left in the text; the harness took it for an answer
DSPY_REJECTED = ("hallucinated_call", "call", False, "dspy")  # fields dspy could not parse: asked again
DSPY_BAD_ARGS = ("invalid_args", "call", False, "dspy")
CASES = [
    # Identical episodes at the same time: three threads, one question, calls told apart by their ids.
    Case("emulated/openai-threads", [[CALL, ANSWER]] * 3, 3),
    # The same three threads each ending with an empty reply: three identical last requests, each
    # its own episode's turn (told apart by the call ids their history carries, and none started
    # after another had failed), not one turn of three retries.
    Case("emulated/openai-threads-empty", [[CALL, ("non_response", None, False, None)]] * 3, 0),
    # inspect-ai runs its three epochs at once.
    Case("emulated/inspect-epochs", [[CALL, ANSWER]] * 3, 3),
    # pydantic-ai drops the empty reply and asks again with its own note: one episode.
    Case("emulated/pydantic-retry", [[CALL, ("non_response", None, False, None), ANSWER]], 1),
    # ToolCallingAgent: a call, a reply smolagents could not parse (rejected), then at max_steps its
    # summary request without tools, in the same episode. CodeAgent: code that calls the tool, then
    # code that calls final_answer (the answer).
    Case(
        "emulated/smolagents-steps",
        [
            [CALL, ("prose", "call", False, None), ("prose", "no_tools", False, None)],
            [("valid_call", "call", True, "code"), ("valid_call", "answer", False, "code")],
        ],
        1,
    ),
    # max_steps=1 right after smolagents ran a call it parsed out of the text: its wrap-up (another
    # system prompt, no tools, the call rewritten as "Calling tools:" text) goes on with the episode,
    # and the call it ran is delivered.
    Case("emulated/smolagents-text", [[CALL, ("prose", "no_tools", False, None)]], 0),
    # dspy ReAct: the call, finish (the answer; dspy acted on it: "Completed."), the extract step.
    Case(
        "emulated/dspy-react",
        [
            [
                ("valid_call", "call", True, "dspy"),
                ("valid_call", "answer", True, "dspy"),
                ("prose", "no_tools", False, "dspy"),
            ]
        ],
        1,
    ),
    # LangChain's classic ReAct: Action / Action Input, then the Final Answer after the Observation.
    Case("emulated/langchain-react", [[("valid_call", "call", True, "react"), ("prose", "answer", False, "react")]], 1),
    # Qwen2.5-Coder-0.5B on llama.cpp writes its call as JSON in the text, which the stack leaves
    # there: the harness never got a call and took the text for its answer.
    Case("llamacpp/openai-threads", [[TEXT_CALL]] * 3, 0, "3 final texts are calls left in the text"),
    Case("llamacpp/inspect-epochs", [[TEXT_CALL]] * 3, 0, "3 final texts are calls left in the text"),
    Case("llamacpp/pydantic-retry", [[TEXT_CALL]], 0, "1 final text is a call left in the text"),
    # ToolCallingAgent: an empty reply (smolagents writes it into its history with its error), prose
    # it cannot parse (rejected), then its summary at max_steps. CodeAgent: prose without code
    # (rejected: "Error in code parsing"), two code steps calling an invented function, the summary.
    Case(
        "llamacpp/smolagents-steps",
        [
            [("non_response", None, False, None), ("prose", "call", False, None), ("prose", "no_tools", False, None)],
            [("prose", "call", False, "code")]
            + [("hallucinated_call", "call", False, "code")] * 2
            + [("prose", "no_tools", False, "code")],
        ],
        0,
    ),
    # dspy ReAct: schema-shaped arguments ({"city": {"type": "string"}}) that dspy rejected, then
    # finish (with arguments it does not take) and an invented answer.
    Case(
        "llamacpp/dspy-react",
        [
            [
                ("invalid_args", "call", False, "dspy"),
                ("invalid_args", "answer", False, "dspy"),
                ("prose", "no_tools", False, "dspy"),
            ]
        ],
        1,
    ),
    # LangChain ReAct: "Action: get_weather(city='Paris')" four times, "not a valid tool" each time.
    Case("llamacpp/langchain-react", [[("hallucinated_call", "call", False, "react")] * 4], 0),
    # The truth rig's recordings (`toolproxy run`, two tasks each). smolagents parses the calls left
    # in the text itself: Paris is get_weather, then final_answer (the answer). Tokyo runs to
    # max_steps and is one episode, although smolagents writes a call it ran back as text
    # ("Calling tools:") after one it kept as it came (an unknown tool): only that echo continues it.
    Case(
        "llamacpp/truth-smolagents",
        [
            [CALL, ("valid_call", "answer", False, None)],
            [
                CALL,
                ("hallucinated_call", "call", False, None),
                CALL,
                ("hallucinated_call", "call", False, None),
                ("hallucinated_call", "no_tools", False, None),
            ],
        ],
        1,
    ),
    # dspy could not parse the ChatAdapter's fields and asked the same step again through its JSON
    # fallback: the same episode, the unparsed reply rejected. Paris ran out of iterations, its last
    # step's arguments broken JSON that dspy repaired before writing the step into its extract
    # prompt: still one episode, the extraction its no_tools wrap-up. Tokyo chose finish after its
    # tool's error: an answer to the report (a tool result came back), not after the tool ran.
    Case(
        "llamacpp/truth-dspy",
        [
            [DSPY_REJECTED, DSPY_BAD_ARGS] * 3 + [DSPY_BAD_ARGS, ("prose", "no_tools", False, "dspy")],
            [DSPY_REJECTED]
            + [DSPY_BAD_ARGS] * 3
            + [("invalid_args", "answer", False, "dspy"), ("prose", "no_tools", False, "dspy")],
        ],
        1,
        "-1: finish came after the tool failed on its arguments: the harness's tool never ran",
    ),
    # mini-swe-agent ends only by its submit command as a bash call: a reply without a tool call is
    # answered "No tool calls found" and dropped, and three in a row end the task unanswered (the
    # last one here the submit command in a bash fence: prose to the harness, not its answer).
    Case(
        "llamacpp/truth-mini-swe-agent",
        [
            [("prose", "call", False, None), TEXT_CALL, ("prose", "call", False, None)],
            [("prose", "call", False, None), CALL, TEXT_CALL, TEXT_CALL, ("prose", "call", False, None)],
        ],
        0,
    ),
    # inspect-ai's react agent: get_weather and then submit, both left in the text, so inspect never
    # got its submit call and returned the last text at its message limit: calls lost, not answers.
    Case("llamacpp/truth-inspect-ai", [[TEXT_CALL] * 3] * 2, 0, "2 final texts are calls left in the text"),
]


def answered(record: dict) -> int:
    """The episodes the harness itself ended with an answer, by its own account (the truth rig's:
    the agent's own answer after the tool ran)."""
    if all("tool_ran" in e for e in record["episodes"]):
        return sum(bool(e["answer"]) and e["tool_ran"] and not e["stopped"] for e in record["episodes"])
    harness = record["harness"]
    if harness.startswith("smolagents"):
        return sum(e.get("state") == "success" for e in record["episodes"])
    if harness.startswith("dspy"):
        return sum("finish" in (e.get("trajectory") or {}).values() for e in record["episodes"])
    if harness.startswith("langchain"):
        return sum(e["answer"] not in (None, STOPPED) for e in record["episodes"])
    return sum(bool(e["answer"]) for e in record["episodes"])


stores = captured.stores_fixture(DATA)


@pytest.mark.parametrize("case", CASES, ids=[c.path for c in CASES])
def test_episodes_roles_and_delivered_calls_match_what_the_harness_did(stores, case):
    con = stores(case.path)
    record = json.loads((DATA / case.path / "harness.json").read_text())
    rows = con.execute("""
        SELECT t.episode_key, t.outcome, t.role, t.delivered, t.protocol
        FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id ORDER BY e.started_at, e.id""").fetchall()
    assert captured.by_episode(rows) == case.episodes
    assert len(case.episodes) == len(record["episodes"])
    # every tool the harness ran is a delivered call, and no other call was delivered (a harness's
    # finishing tool is the answer, not one of the task's tools)
    executed = con.execute("SELECT count(*) FROM turns WHERE delivered AND NOT finishes").fetchone()[0]
    assert executed == len(record["executions"])
    answers = con.execute("SELECT count(DISTINCT episode_key) FROM turns WHERE role = 'answer'").fetchone()[0]
    assert answers == case.answers
    harness = answered(record)
    assert (harness == answers) == (not case.why), (harness, case.why)
    if case.why:
        assert case.why.startswith(str(harness - answers))


def test_the_protocol_a_turn_was_read_under_is_recorded_with_its_calls(stores):
    """Calls written under a prompt protocol have the surface `prompt` (the harness asked for them
    there and parses them itself); the tools its prompt offered are a tool set like any other."""
    con = stores("emulated/dspy-react")
    calls = con.execute("""
        SELECT c.name, c.arguments::VARCHAR, c.surface, c.format, c.valid FROM calls c JOIN exchanges e ON e.id =
            c.exchange_id
        ORDER BY e.started_at""").fetchall()
    assert calls == [
        ("get_weather", '{"city":"Paris"}', "prompt", "dspy", True),
        ("finish", "{}", "prompt", "dspy", True),
    ]
    names = con.execute("SELECT DISTINCT s.names FROM exchanges e JOIN tool_sets s ON s.hash = e.tool_set").fetchall()
    assert names == [(["get_weather", "finish"],)]
    con = stores("emulated/smolagents-steps")
    assert con.execute(
        "SELECT protocol, count(*) FROM exchanges WHERE is_attempt GROUP BY ALL ORDER BY 1"
    ).fetchall() == [("code", 2), (None, 3)]


def test_the_report_counts_what_the_harnesses_counted(tmp_path):
    """Every emulated case through one `toolproxy report`: episodes and answers as the harnesses
    ran and got them, and the prompt-protocol runs measured like the others."""
    import shutil
    import subprocess
    import sys

    data = tmp_path / "data"
    for case in (c for c in CASES if c.path.startswith("emulated/")):
        for seg in (DATA / case.path / "segments").glob("*.jsonl"):
            (data / "segments").mkdir(parents=True, exist_ok=True)
            shutil.copy(seg, data / "segments" / seg.name)
    out = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "analyze", "--data", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "toolproxy.cli", "report", "--data", str(data), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    )
    (run,) = doc["runs"]
    records = [
        json.loads((DATA / c.path / "harness.json").read_text()) for c in CASES if c.path.startswith("emulated/")
    ]
    assert run["episodes"] == sum(len(r["episodes"]) for r in records) == 15
    a = run["answer_rate"]
    assert (a["numerator"], a["denominator"]) == (sum(answered(r) for r in records), 15) == (10, 15)
    c = run["call_fidelity"]
    assert (c["numerator"], c["denominator"]) == (15, 16)  # the one miss: the reply smolagents rejected


@pytest.mark.parametrize("case", CASES, ids=[c.path for c in CASES])
def test_the_live_page_derives_the_turns_the_analyzer_stores(stores, case):
    """The live classifier, fed the same records one by one, derives the same episodes, turns,
    roles and figures as `analyze` and `report` (the same code: analysis.episodes)."""
    import orjson

    from toolproxy.analysis.measure.metrics import run_metrics, score
    from toolproxy.live.tally import Tally, summarised
    from toolproxy.record.segments import read_records

    tally = Tally()
    for rec in read_records(DATA / case.path, "exchange"):
        assert tally.add(orjson.dumps(rec)) is not None
    live = {name: summarised(name, counts) for name, counts in tally.report(None, None, 0)["runs"].items()}
    con = stores(case.path)
    runs = [r[0] for r in con.execute("SELECT run FROM runs ORDER BY run").fetchall()]
    score(con, runs)
    report = run_metrics(con, runs, resamples=0)
    assert sorted(live) == runs
    for run, m in report.items():
        page = live[run]
        n_turns, n_episodes = con.execute("SELECT n_turns, n_episodes FROM runs WHERE run = ?", [run]).fetchone()
        assert (page["turns"], page["episodes"]) == (n_turns, n_episodes)
        assert page["roles"] == {k: v for k, v in m.roles.items() if v}
        assert (page["valid_turns"], page["delivered_turns"], page["call_turns"]) == (
            m.call_fidelity.numerator,
            m.delivered_fidelity.numerator,
            m.call_fidelity.denominator,
        )
        assert (page["answered"], page["answerable"]) == (m.answer_rate.numerator, m.answer_rate.denominator)
        assert page["turn_non_responses"] == m.non_response_kinds
        assert page["partial"] is None
