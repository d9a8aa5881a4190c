"""Coding agents' tasks counted as they ran, against each agent's own record.

Each case in tests/data/agents is one run of a real coding agent at its pinned version through
`toolproxy serve`, untagged, with the agent's own record beside it (its stream-json, exec --json,
session files or chat history: tests/data/agents/records.py reads them). `toolproxy analyze` runs on
the proxy's unedited segments, and what it concludes is checked against that record: as many tasks
as the agent ran (its side requests none of them, its subagents children of the call that started
them, its compaction the same task going on), as many delivered calls as tool uses it ran, every
task it answered answered, and full marks for an agent that did its task.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import captured
import pytest

from toolproxy.analysis.measure.runline import from_report, sides_text

DATA = Path(__file__).resolve().parent.parent / "data" / "agents"
sys.path.insert(0, str(DATA))
from records import own  # noqa: E402


@dataclass(frozen=True)
class Case:
    path: str
    sides: dict  # the side requests, by kind, as the agent's source writes them
    roles: list  # per task episode then subagent episodes, in order of their first request: the roles of its turns
    links: dict = field(default_factory=dict)  # link kind -> how many episodes are linked so


CASES = [
    Case("emulated/claude-title", {"title": 1, "prewarm": 1}, [["call", "answer"]]),
    Case(
        "emulated/claude-subagent",
        {"title": 1, "prewarm": 1},
        [["call", "answer"], ["call", "answer"]],
        {"subagent": 1},
    ),
    Case(
        "emulated/claude-compact",
        {"title": 1, "summary": 1, "prewarm": 3},
        [["call", "answer"], ["answer"]],
        {"compaction": 1},
    ),
    Case("emulated/claude-abandon", {"prewarm": 1}, [["call", "answer"]]),
    Case("emulated/claude-keepalive", {"prewarm": 1}, [["call", "answer"]]),
    Case("emulated/codex-abandon", {}, [["call", "answer"]]),
    Case("emulated/codex", {}, [["call", "answer"]]),
    Case("emulated/qwen-write", {}, [["call", "answer"]]),
    # answered without a tool: open (nothing says whether a tool was due), whatever the memory pass after it
    Case("emulated/qwen-memory", {"memory": 1}, [["open"]]),
    Case("emulated/opencode-title", {"title": 1}, [["call", "answer"]]),
    Case("emulated/opencode-subagent", {"title": 1}, [["call", "answer"], ["call", "answer"]], {"subagent": 1}),
    Case("emulated/aider", {"commit_message": 2}, [["no_tools"]]),
    Case("emulated/mini-swe-agent", {}, [["call", "answer"]]),
    # its routing request picks the model (a side request); the task goes through --bridge gemini
    Case("emulated/gemini-cli", {"routing": 1}, [["call", "answer"]]),
    # the real llama-server: the model wrote its call as JSON in the text, which the agent took for
    # its answer (a call, undelivered: no tool ran)
    Case("llamacpp/claude-title", {"title": 1, "prewarm": 1}, [["call"]]),
    Case("llamacpp/opencode-title", {"title": 1}, [["call"]]),
]
FULL_MARKS = [
    c for c in CASES if c.path.startswith("emulated/") and c.path not in ("emulated/qwen-memory", "emulated/aider")
]


stores = captured.stores_fixture(DATA)


@pytest.mark.parametrize("case", CASES, ids=[c.path for c in CASES])
def test_tasks_side_requests_and_tool_uses_are_the_agents_own(stores, case):
    con = stores(case.path)
    record = own(DATA / case.path)
    sides = dict(
        con.execute("SELECT side_request, count(*) FROM exchanges WHERE side_request IS NOT NULL GROUP BY 1").fetchall()
    )
    assert sides == case.sides
    rows = con.execute("""
        SELECT t.episode_key, t.role FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id
        ORDER BY e.started_at, e.id""").fetchall()
    assert captured.by_episode(rows) == [[(r,) for r in roles] for roles in case.roles]
    # as many tasks as the agent ran, each subagent a child of the call the agent says started it
    tasks = con.execute("SELECT count(*) FROM episodes WHERE parent_episode IS NULL").fetchone()[0]
    assert tasks == record["tasks"]
    children = con.execute("SELECT parent_call FROM episodes WHERE link = 'subagent' ORDER BY parent_call").fetchall()
    assert [c for (c,) in children] == sorted(s["call"] for s in record["subagents"])
    links = dict(con.execute("SELECT link, count(*) FROM episodes WHERE link IS NOT NULL GROUP BY 1").fetchall())
    assert links == case.links
    # every tool use the agent ran is a delivered call (a finishing call is its answer, not a use)
    delivered = con.execute("SELECT count(*) FROM turns WHERE delivered AND NOT finishes").fetchone()[0]
    assert delivered == len(record["tool_uses"])


@pytest.mark.parametrize("case", FULL_MARKS, ids=lambda c: c.path)
def test_an_agent_that_did_its_task_gets_full_marks(tmp_path, case):
    """Every agent here wrote hello.txt and said so: call fidelity, delivered fidelity and the
    answer rate are all of its tasks, whatever side requests, subagents and compactions it made."""
    data = tmp_path / "data"
    import shutil
    import subprocess

    shutil.copytree(DATA / case.path / "segments", data / "segments")
    assert (
        subprocess.run(
            [sys.executable, "-m", "toolproxy.cli", "analyze", "--data", str(data)], capture_output=True, timeout=120
        ).returncode
        == 0
    )
    out = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "report", "--data", str(data), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    (run,) = __import__("json").loads(out.stdout)["runs"]
    record = own(DATA / case.path)
    assert run["episodes"] == record["tasks"]
    for metric in ("call_fidelity", "delivered_fidelity", "answer_rate"):
        m = run[metric]
        assert m["denominator"] > 0 and m["numerator"] == m["denominator"], (metric, m)
    assert run["side_requests"] == case.sides
    # the run line (`toolproxy run`, `study`) says them apart from the turns
    line = from_report(run).text()
    assert line.endswith(f"; side requests: {sides_text(case.sides)}" if case.sides else "non-responses 0"), line
    # the HTML page draws each task with subagents or compactions as its tree, each subagent under its call
    page = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "report", "--data", str(data), "--format", "html"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    _, trees = page.partition("<h2>Tasks with subagents or compactions</h2>")[::2]
    assert bool(trees) == bool(case.links)
    trees = trees.partition("</section>")[0]
    assert trees.count("<li><code>") == (1 + sum(case.links.values()) if case.links else 0)
    assert trees.count("</code>: after a compaction") == case.links.get("compaction", 0)
    for sub in record["subagents"]:
        assert f"subagent of call {sub['call']}" in trees
    if not case.links:
        return
    # `show` of a linked episode's exchange draws its task's tree and marks where the exchange is
    from toolproxy.analysis.store.connection import connect

    con = connect(data / "toolproxy.duckdb", read_only=True)
    try:
        ((exchange, how),) = con.execute("""
            SELECT t.final_exchange_id, ep.link FROM turns t JOIN episodes ep USING (episode_key)
            WHERE ep.link IS NOT NULL ORDER BY t.turn_index LIMIT 1""").fetchall()
    finally:
        con.close()
    shown = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "show", "--data", str(data), exchange],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    (marked,) = [line for line in shown.splitlines() if line.endswith("<- this exchange's")]
    assert ("subagent of call" if how == "subagent" else "after a compaction") in marked
    assert "the task," in shown


@pytest.mark.parametrize(
    "path,waited",
    [
        ("emulated/claude-abandon", "before the stack answered"),
        ("emulated/codex-abandon", "with bytes but no token received"),
    ],
)
def test_a_client_that_gave_up_is_named_so_and_its_retry_is_the_same_turn(stores, path, waited):
    """Claude Code's API_TIMEOUT_MS against a stack that had not answered, Codex's stream idle
    timeout against keep-alive comments: the abandoned attempt is the harness's giving up (not a
    stream the stack cut), and the request it asked again is the same turn."""
    con = stores(path)
    rows = con.execute("""
        SELECT e.sub_kind, json_extract_string(e.record, '$.classification_detail'), t.n_attempts, t.outcome
        FROM exchanges e JOIN turns t USING (turn_id)
        WHERE e.error_kind = 'client_closed' AND e.outcome = 'non_response'
    """).fetchall()
    assert len(rows) == 1
    sub_kind, detail, attempts, outcome = rows[0]
    assert sub_kind == "client_gave_up" and waited in detail
    assert (attempts, outcome) == (2, "valid_call")


def test_keepalive_comments_are_no_first_token(stores):
    """The emulated llama.cpp sent 4 s of `:` comments before its first event: the proxy's first
    byte came in milliseconds, the first token when the comments stopped."""
    con = stores("emulated/claude-keepalive")
    ((ttfb, ttft),) = con.execute("SELECT ttfb_ms, ttft_ms FROM exchanges WHERE ttft_ms > ttfb_ms").fetchall()
    assert ttft - ttfb > 3500 and ttfb < ttft / 10
    others = con.execute("SELECT count(*) FROM exchanges WHERE is_attempt AND ttft_ms <> ttfb_ms").fetchone()[0]
    assert others == 1  # every other reply's first byte was its first token


def test_a_first_request_abandoned_six_times_on_a_real_stack_is_one_turn(stores):
    """Claude Code on the real llama-server: six attempts given up after about 300 s of keep-alive
    comments each (the last four before the server had sent anything), then the answer without
    streaming: one turn of seven attempts, each abandoned one the harness's doing, not a cut stream."""
    con = stores("llamacpp/claude-title")
    ((attempts, outcome),) = con.execute("SELECT n_attempts, outcome FROM turns").fetchall()
    assert (attempts, outcome) == (7, "invalid_args")
    kinds = con.execute(
        "SELECT sub_kind, count(*) FROM exchanges WHERE is_attempt AND outcome = 'non_response' GROUP BY 1"
    ).fetchall()
    assert kinds == [("client_gave_up", 6)]


def test_the_live_page_counts_side_requests_apart():
    """Fed Claude Code's capture record by record, the live page counts its title request and its
    preconnect HEAD as side requests (not as a 404 of the run, not as an episode) and its line says so."""
    import orjson

    from toolproxy.live.tally import Tally, summarised
    from toolproxy.record.segments import read_records

    tally = Tally()
    for rec in read_records(DATA / "emulated/claude-title", "exchange"):
        assert tally.add(orjson.dumps(rec)) is not None
    ((name, counts),) = tally.report(None, None, 0)["runs"].items()
    page = summarised(name, counts)
    assert page["side_requests"] == {"prewarm": 1, "title": 1}
    assert page["by_status_class"] == {"2xx": 2, "side": 2}
    assert page["episodes"] == 1 and page["line"].endswith("; side requests: 1 prewarm, 1 title")
