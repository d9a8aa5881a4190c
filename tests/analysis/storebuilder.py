"""Real DuckDB files with exactly the analyzer's table contract, built from a compact episode list.

The schema is the analyzer's own (its migrations create the file); only the rows are written
here, so summary, report and compare are tested against the real tables without depending on
ingest and classification getting every case right first.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path

from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.analysis.episodes.roles import ROLE_SQL
from toolproxy.analysis.measure.summary import Report, select_runs, summarize
from toolproxy.analysis.store import connection as store
from toolproxy.analysis.store.state import save_state

CALLING = {"valid_call", "invalid_args", "hallucinated_call"}


@dataclass
class Turn:
    outcome: str
    sub_kind: str | None = None
    surface: str | None = None
    saw_prose: bool = False


@dataclass
class Episode:
    episode: str
    turns: list[Turn]
    item_key: str | None = None
    category: str | None = None
    looping: bool = False
    expect: str | None = None


@dataclass
class Run:
    run: str
    stack: str
    stack_version: str
    model: str
    condition: str
    episodes: list[Episode] = field(default_factory=list)


def T(spec: str) -> Turn:
    """'valid_call', 'valid_call@text', 'valid_call@text!' (harness saw prose), 'non_response:refused'."""
    saw_prose = spec.endswith("!")
    spec = spec.rstrip("!")
    spec, _, surface = spec.partition("@")
    outcome, _, sub_kind = spec.partition(":")
    if outcome in CALLING and not surface:
        surface = "native"
    return Turn(outcome, sub_kind or None, surface or None, saw_prose)


COLUMNS = {
    "episodes": (
        "episode_key",
        "run",
        "episode",
        "reconstructed",
        "item_key",
        "category",
        "n_turns",
        "looping",
        "loop_reason",
        "expect",
        "tags",
        "analyzer_version",
    ),
    "turns": (
        "turn_id",
        "run",
        "episode_key",
        "turn_index",
        "item_key",
        "category",
        "condition",
        "model",
        "outcome",
        "sub_kind",
        "surface",
        "n_attempts",
        "n_calls",
        "final_exchange_id",
        "finish_reason",
        "harness_saw_prose",
        "content",
        "expect",
        "delivered",
        "offered_tools",
        "tool_results",
        "saw_result",
        "is_last",
        "analyzer_version",
    ),
    "calls": (
        "turn_id",
        "exchange_id",
        "idx",
        "name",
        "arguments_raw",
        "arguments",
        "surface",
        "format",
        "offered",
        "validated",
        "valid",
        "schema_errors",
    ),
    "runs": (
        "run",
        "stack",
        "stack_version",
        "model",
        "condition",
        "n_exchanges",
        "n_episodes",
        "n_turns",
        "first_seen",
        "last_seen",
        "analyzer_version",
    ),
}


def _rows(runs: list[Run]) -> dict[str, list[tuple]]:
    rows: dict[str, list[tuple]] = {table: [] for table in COLUMNS}
    t0 = dt.datetime(2026, 11, 3, 9, 0, 0)
    for r in runs:
        n_turns = sum(len(e.turns) for e in r.episodes)
        rows["runs"].append(
            (
                r.run,
                r.stack,
                r.stack_version,
                r.model,
                r.condition,
                n_turns,
                len(r.episodes),
                n_turns,
                t0,
                t0 + dt.timedelta(minutes=5),
                ANALYZER_VERSION,
            )
        )
        for e in r.episodes:
            key = f"{r.run}/{e.episode}"
            tags = {
                k: v
                for k, v in (
                    ("run", r.run),
                    ("episode", e.episode),
                    ("item", e.item_key),
                    ("category", e.category),
                    ("expect", e.expect),
                )
                if v is not None
            }
            rows["episodes"].append(
                (
                    key,
                    r.run,
                    e.episode,
                    False,
                    e.item_key,
                    e.category,
                    len(e.turns),
                    e.looping,
                    "identical consecutive calls" if e.looping else None,
                    e.expect,
                    json.dumps(tags),
                    ANALYZER_VERSION,
                )
            )
            results = 0
            for i, t in enumerate(e.turns):
                turn_id = f"{key}#{i}"
                has_call = t.outcome in CALLING or t.saw_prose
                content = {"text": '<tool_call>{"name": "get_weather"}</tool_call>'}.get(t.surface or "", "")
                if t.outcome == "prose":
                    content = "It is sunny in Paris."
                # The harness returns a result after every turn that called: later turns have seen one.
                rows["turns"].append(
                    (
                        turn_id,
                        r.run,
                        key,
                        i,
                        e.item_key,
                        e.category,
                        r.condition,
                        r.model,
                        t.outcome,
                        t.sub_kind,
                        t.surface,
                        1,
                        int(has_call),
                        f"x-{turn_id}",
                        "stop",
                        t.saw_prose,
                        content,
                        e.expect,
                        t.outcome == "valid_call" and not t.saw_prose,
                        True,
                        results,
                        results > 0,
                        i == len(e.turns) - 1,
                        ANALYZER_VERSION,
                    )
                )
                results += t.outcome in CALLING
                if has_call:
                    rows["calls"].append(
                        (
                            turn_id,
                            f"x-{turn_id}",
                            0,
                            "book_flight" if t.outcome == "hallucinated_call" else "get_weather",
                            '{"city": "Paris"}',
                            '{"city": "Paris"}',
                            t.surface or "text",
                            "hermes" if t.saw_prose else "tool_calls",  # left in text, or what the harness got
                            t.outcome != "hallucinated_call",
                            True,
                            t.outcome == "valid_call",
                            '["missing city"]' if t.outcome == "invalid_args" else "[]",
                        )
                    )
    return rows


def build_store(path: Path, runs: list[Run]) -> Path:
    """A store made by the analyzer's migrations, holding exactly these runs."""
    con = store.connect(path)
    try:
        for table, rows in _rows(runs).items():
            if rows:
                cols = COLUMNS[table]
                con.executemany(f"insert into {table} ({', '.join(cols)}) values ({', '.join('?' * len(cols))})", rows)
        con.execute(f"update turns set role = {ROLE_SQL}")
        save_state(con, [])
    finally:
        con.close()
    return path


def mixed_runs() -> list[Run]:
    """Four runs that between them show every outcome, every situation a report must not hide."""
    return [
        Run(
            "qwen-native",
            "ollama",
            "0.12.6",
            "qwen3:8b",
            "native",
            [
                Episode("0", [T("valid_call"), T("valid_call"), T("prose")], "bfcl:simple_1", "simple"),
                Episode("1", [T("invalid_args"), T("valid_call")], "bfcl:simple_2", "simple"),
                Episode(
                    "2",
                    [T("hallucinated_call"), T("unparseable"), T("non_response:http_5xx")],
                    "bfcl:multiple_1",
                    "multiple",
                ),
                Episode("3", [T("valid_call")] * 9 + [T("invalid_args")], "bfcl:multiple_2", "multiple", looping=True),
                Episode("4", [T("non_response:timeout"), T("non_response:refused")], "bfcl:simple_3", "simple"),
            ],
        ),
        Run(
            "qwen-text",
            "ollama",
            "0.12.6",
            "qwen3:8b",
            "text",
            [
                Episode("0", [T("valid_call@text"), T("valid_call@text")], "bfcl:simple_1", "simple"),
                Episode("1", [T("valid_call@text")], "bfcl:simple_2", "simple"),
                Episode("2", [T("invalid_args@text")], "bfcl:multiple_1", "multiple"),
                Episode("3", [T("valid_call@text")], "bfcl:multiple_2", "multiple"),
            ],
        ),
        Run(
            "gemma-vllm",
            "vllm",
            "0.11.0",
            "google/gemma-3-4b-it",
            "native",
            [Episode(str(i), [T("non_response:refused")] * 2, f"bfcl:simple_{i}", "simple") for i in range(1, 4)],
        ),
        Run(
            "qwen-sglang",
            "sglang",
            "0.5.3",
            "Qwen/Qwen3-8B",
            "native",
            [
                Episode("0", [T("valid_call@text!"), T("valid_call@text!")], "bfcl:simple_1", "simple"),
                Episode("1", [T("valid_call@native"), T("prose")], "bfcl:simple_2", "simple"),
            ],
        ),
    ]


def paired_runs(table: dict[str, tuple[int, int, int, int]], run_a: str = "A", run_b: str = "B") -> list[Run]:
    """Two runs over the same single-turn items with a chosen 2x2 table per category.

    table[category] = (both pass, A only, B only, both fail). A failing item alternates between an
    invalid-arguments turn and a refused request, the two ways an item fails in practice.
    """
    a, b = Run(run_a, "ollama", "0.12.6", "qwen3:8b", "native"), Run(run_b, "ollama", "0.12.6", "qwen3:8b", "text")
    for category, counts in table.items():
        verdicts = (
            [(True, True)] * counts[0]
            + [(True, False)] * counts[1]
            + [(False, True)] * counts[2]
            + [(False, False)] * counts[3]
        )
        for i, (pass_a, pass_b) in enumerate(verdicts):
            item = f"{category}_{i}"
            fail = T("invalid_args") if i % 2 else T("non_response:refused")
            a.episodes.append(Episode(item, [T("valid_call") if pass_a else fail], item, category))
            b.episodes.append(Episode(item, [T("valid_call@text") if pass_b else fail], item, category))
    return [a, b]


def load_report(path: Path, runs: list[str] | None = None, seed: int = 0) -> Report:
    """What `toolproxy report` computes, without the rendering."""
    con = store.connect(path, read_only=True)
    try:
        return summarize(con, select_runs(con, runs, path), str(path), seed=seed)
    finally:
        con.close()
