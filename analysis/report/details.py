"""What only the HTML report shows beside the per-run numbers: fidelity by turn index, by category,
the paired comparisons between runs, and latency and tokens per run.

Read from the same store, runs and expectation rules as analysis.measure.summary, scored the same way
(analysis.measure.metrics.score), so the page's figures count exactly the turns its headline counts.
DuckDB does the counting; out come plain dataclasses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from toolproxy.analysis.classify.expectations import ExpectationRule, parse_rules
from toolproxy.analysis.measure import stats
from toolproxy.analysis.measure.compare import Comparison, compare
from toolproxy.analysis.measure.metrics import score
from toolproxy.analysis.measure.summary import Report

# Turn positions shown one by one; later turns share the last column ("11+"), so one very long
# episode cannot stretch the figure while the question (does fidelity decay?) still gets an answer.
TURN_COLUMNS = 10
# Paired comparisons drawn at most (every pair of runs that share items, in report order).
MAX_PAIRS = 12
# Tasks whose trees the page draws per run: the ones with subagents or compactions, first by key.
MAX_TREES = 20


@dataclass(frozen=True)
class Count:
    """Of n turns due a call, k held a valid call and d delivered one to the harness (n = 0:
    nothing to rate)."""

    k: int
    d: int
    n: int

    @property
    def call(self) -> float | None:
        return stats.rate(self.k, self.n)

    @property
    def delivered(self) -> float | None:
        return stats.rate(self.d, self.n)


NONE = Count(0, 0, 0)
# Call and delivered fidelity counts over the scored turns (analysis.measure.metrics.score), grouped by the caller.
_COUNTS = (
    "count(*) filter (where role = 'call' and outcome = 'valid_call'), "
    "count(*) filter (where role = 'call' and delivered), count(*) filter (where role = 'call')"
)


@dataclass(frozen=True)
class TaskNode:
    """One episode of a task's tree, under its parent (depth 0 is the task's own first episode)."""

    depth: int
    episode: str
    how: str  # what it is of the task: the task, a subagent of a call, after a compaction
    turns: int


def task_tree(rows: Sequence[tuple]) -> list[TaskNode]:
    """A task's episodes (episode_key, parent_episode, parent_call, link, n_turns) as a tree, depth
    first: `show` and the HTML page draw the same tree."""
    children: dict = {}
    for key, parent, call, link, n in sorted(rows, key=lambda r: r[0]):
        children.setdefault(parent, []).append((key, call, link, n))
    out: list[TaskNode] = []

    def walk(parent, depth: int) -> None:
        for key, call, link, n in children.get(parent, ()):
            how = {"subagent": f"subagent of call {call}", "compaction": "after a compaction"}.get(link, "the task")
            out.append(TaskNode(depth, key, how, int(n or 0)))
            walk(key, depth + 1)

    walk(None, 0)
    return out


def linked_tasks(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> dict[str, list[list[TaskNode]]]:
    """Per run, the trees of its tasks that have more than one episode (subagents, compactions),
    at most MAX_TREES of them."""
    rows = con.execute(
        """
        WITH linked AS (
            SELECT run, task_key FROM episodes
            WHERE run IN (SELECT unnest($runs::VARCHAR[])) AND parent_episode IS NOT NULL
            GROUP BY ALL
        ), picked AS (
            SELECT run, task_key FROM linked QUALIFY row_number() OVER (PARTITION BY run ORDER BY task_key) <= $most
        )
        SELECT e.run, e.task_key, e.episode_key, e.parent_episode, e.parent_call, e.link, e.n_turns
        FROM episodes e JOIN picked USING (run, task_key) ORDER BY e.run, e.task_key
        """,
        {"runs": list(runs), "most": MAX_TREES},
    ).fetchall()
    tasks: dict[tuple[str, str], list[tuple]] = {}
    for run, task, *row in rows:
        tasks.setdefault((run, task), []).append(tuple(row))
    out: dict[str, list[list[TaskNode]]] = {}
    for (run, _), members in tasks.items():
        out.setdefault(run, []).append(task_tree(members))
    return out


@dataclass(frozen=True)
class RunUsage:
    """One run's speed and size, over the attempts the model answered (non-responses left out: a
    refusal in 2 ms says nothing about how fast the model is). Token sums are over the attempts
    whose stack reported usage; cached is None when no response reported a cache figure."""

    run: str
    answered: int
    ttfb_p50_ms: float | None
    ttfb_p95_ms: float | None
    total_p50_ms: float | None
    total_p95_ms: float | None
    reported: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None

    @property
    def cached_share(self) -> float | None:
        return None if self.cached_tokens is None else stats.rate(self.cached_tokens, self.prompt_tokens)


@dataclass
class PageDetails:
    by_turn: dict[str, list[Count]]  # run -> one Count per turn column
    categories: list[str]
    by_category: dict[tuple[str, str], Count]  # (run, category) -> Count
    comparisons: list[Comparison]
    pairs_left_out: int
    usage: dict[str, RunUsage]
    tasks: dict[str, list[list[TaskNode]]]  # run -> the trees of its linked tasks (linked_tasks)


def by_turn_index(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> dict[str, list[Count]]:
    """Call and delivered fidelity at each turn position of an episode."""
    rows = con.execute(f"""
        select run, least(turn_index, {TURN_COLUMNS - 1}) as col, {_COUNTS} from scored group by all
    """).fetchall()
    out = {run: [NONE] * TURN_COLUMNS for run in runs}
    for run, col, k, d, n in rows:
        out[run][col] = Count(int(k), int(d), int(n))
    return out


def by_category(con: duckdb.DuckDBPyConnection) -> tuple[list[str], dict[tuple[str, str], Count]]:
    """Call and delivered fidelity per (run, category); categories come from the `category` tag or
    the item key."""
    rows = con.execute(
        f"select run, category, {_COUNTS} from scored where category is not null group by all"
    ).fetchall()
    cells = {(run, cat): Count(int(k), int(d), int(n)) for run, cat, k, d, n in rows if n}
    return sorted({cat for _, cat in cells}), cells


def comparisons(
    con: duckdb.DuckDBPyConnection,
    runs: Sequence[str],
    models: dict[str, str | None],
    rules: Sequence[ExpectationRule] = (),
) -> tuple[list[Comparison], int]:
    """compare() for every pair of runs that share items, by category (Holm) when the pair's items
    fall in more than one category. Pairs of one model (an interface or stack compared on fixed
    weights, the usual question) come first, then report order. Returns the comparisons and how
    many pairs were left out beyond MAX_PAIRS."""
    shared = con.execute(
        """
        with items as (select distinct run, item_key, category from episodes
                       where run in (select unnest(?::varchar[])) and item_key is not null)
        select a.run, b.run, count(distinct coalesce(a.category, b.category))
        from items a join items b on a.item_key = b.item_key and a.run <> b.run group by all
    """,
        [list(runs)],
    ).fetchall()
    order = {run: i for i, run in enumerate(runs)}
    pairs = sorted(
        ((a, b, n) for a, b, n in shared if order[a] < order[b]),
        key=lambda p: (models.get(p[0]) != models.get(p[1]), order[p[0]], order[p[1]]),
    )
    out = [compare(con, a, b, by_category=n > 1, rules=rules) for a, b, n in pairs[:MAX_PAIRS]]
    return out, max(0, len(pairs) - MAX_PAIRS)


def usage(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> dict[str, RunUsage]:
    rows = con.execute(
        """
        select run, count(*) filter (where outcome <> 'non_response'),
               quantile_cont(ttfb_ms, 0.5) filter (where outcome <> 'non_response'),
               quantile_cont(ttfb_ms, 0.95) filter (where outcome <> 'non_response'),
               quantile_cont(duration_ms, 0.5) filter (where outcome <> 'non_response'),
               quantile_cont(duration_ms, 0.95) filter (where outcome <> 'non_response'),
               count(*) filter (where prompt_tokens is not null or completion_tokens is not null),
               coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0), sum(cached_tokens)
        from exchanges where is_attempt and run in (select unnest(?::varchar[])) group by run
    """,
        [list(runs)],
    ).fetchall()
    return {
        r[0]: RunUsage(r[0], int(r[1]), *r[2:6], int(r[6]), int(r[7]), int(r[8]), None if r[9] is None else int(r[9]))
        for r in rows
    }


def page_details(con: duckdb.DuckDBPyConnection, report: Report) -> PageDetails:
    """The figures for the runs of `report`, scored under the same expectation rules."""
    runs = [s.run for s in report.runs]
    rules = parse_rules(report.expect_rules)
    score(con, runs, rules)
    categories, cells = by_category(con)
    turns = by_turn_index(con, runs)
    pairs, left_out = comparisons(con, runs, {s.run: s.model for s in report.runs}, rules)
    return PageDetails(
        by_turn=turns,
        categories=categories,
        by_category=cells,
        comparisons=pairs,
        pairs_left_out=left_out,
        usage=usage(con, runs),
        tasks=linked_tasks(con, runs),
    )
