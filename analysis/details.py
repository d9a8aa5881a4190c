"""What only the HTML report shows beside the per-run numbers: fidelity by turn index, by category,
the paired comparisons between runs, and latency and tokens per run.

Read from the same store and the same runs as analysis.summary, after it, so the page's figures
count exactly the turns its headline counts. DuckDB does the counting; out come plain dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import duckdb

from analysis import stats
from analysis.compare import Comparison, compare
from analysis.summary import Report

# Turn positions shown one by one; later turns share the last column ("11+"), so one very long
# episode cannot stretch the figure while the question (does fidelity decay?) still gets an answer.
TURN_COLUMNS = 10
# Paired comparisons drawn at most (every pair of runs that share items, in report order).
MAX_PAIRS = 12


@dataclass(frozen=True)
class Count:
    """k of n turns (n = 0: nothing to rate)."""

    k: int
    n: int

    @property
    def rate(self) -> float | None:
        return stats.rate(self.k, self.n)


@dataclass(frozen=True)
class Usage:
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
    by_turn: dict[str, list[Count]]          # run -> one Count per turn column
    categories: list[str]
    by_category: dict[tuple[str, str], Count]  # (run, category) -> Count
    comparisons: list[Comparison]
    pairs_left_out: int
    usage: dict[str, Usage]


def _wanted(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> None:
    con.execute("create or replace temp table page_runs as select unnest(?::varchar[]) as run", [list(runs)])


def by_turn_index(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> dict[str, list[Count]]:
    """Fidelity at each turn position: valid calls / turns the model produced there."""
    rows = con.execute(f"""
        select run, least(turn_index, {TURN_COLUMNS - 1}) as col,
               count(*) filter (where outcome = 'valid_call'), count(*) filter (where outcome <> 'non_response')
        from turns where run in (select run from page_runs) group by all
    """).fetchall()
    out = {run: [Count(0, 0) for _ in range(TURN_COLUMNS)] for run in runs}
    for run, col, k, n in rows:
        out[run][col] = Count(int(k), int(n))
    return out


def by_category(con: duckdb.DuckDBPyConnection) -> tuple[list[str], dict[tuple[str, str], Count]]:
    """Fidelity per (run, category); categories come from the `category` tag or the item key."""
    rows = con.execute("""
        select run, category, count(*) filter (where outcome = 'valid_call'),
               count(*) filter (where outcome <> 'non_response')
        from turns where run in (select run from page_runs) and category is not null group by all
    """).fetchall()
    cells = {(run, cat): Count(int(k), int(n)) for run, cat, k, n in rows}
    return sorted({cat for _, cat in cells}), cells


def comparisons(con: duckdb.DuckDBPyConnection, runs: Sequence[str], models: dict[str, str | None]) -> tuple[list[Comparison], int]:
    """compare() for every pair of runs that share items, by category (Holm) when the pair's items
    fall in more than one category. Pairs of one model (an interface or stack compared on fixed
    weights, the usual question) come first, then report order. Returns the comparisons and how
    many pairs were left out beyond MAX_PAIRS."""
    shared = con.execute("""
        with items as (select distinct run, item_key, category from episodes
                       where run in (select run from page_runs) and item_key is not null)
        select a.run, b.run, count(distinct coalesce(a.category, b.category))
        from items a join items b on a.item_key = b.item_key and a.run <> b.run group by all
    """).fetchall()
    order = {run: i for i, run in enumerate(runs)}
    pairs = sorted(((a, b, n) for a, b, n in shared if order[a] < order[b]),
                   key=lambda p: (models.get(p[0]) != models.get(p[1]), order[p[0]], order[p[1]]))
    out = [compare(con, a, b, by_category=n > 1) for a, b, n in pairs[:MAX_PAIRS]]
    return out, max(0, len(pairs) - MAX_PAIRS)


def usage(con: duckdb.DuckDBPyConnection) -> dict[str, Usage]:
    rows = con.execute("""
        select run, count(*) filter (where outcome <> 'non_response'),
               quantile_cont(ttfb_ms, 0.5) filter (where outcome <> 'non_response'),
               quantile_cont(ttfb_ms, 0.95) filter (where outcome <> 'non_response'),
               quantile_cont(duration_ms, 0.5) filter (where outcome <> 'non_response'),
               quantile_cont(duration_ms, 0.95) filter (where outcome <> 'non_response'),
               count(*) filter (where prompt_tokens is not null or completion_tokens is not null),
               coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0), sum(cached_tokens)
        from exchanges where is_attempt and run in (select run from page_runs) group by run
    """).fetchall()
    return {r[0]: Usage(r[0], int(r[1]), *r[2:6], int(r[6]), int(r[7]), int(r[8]),
                        None if r[9] is None else int(r[9])) for r in rows}


def page_details(con: duckdb.DuckDBPyConnection, report: Report) -> PageDetails:
    """The figures for the runs of `report`, read after summarize() on the same connection."""
    runs = [s.run for s in report.runs]
    _wanted(con, runs)
    categories, cells = by_category(con)
    pairs, left_out = comparisons(con, runs, {s.run: s.model for s in report.runs})
    return PageDetails(by_turn=by_turn_index(con, runs), categories=categories, by_category=cells,
                       comparisons=pairs, pairs_left_out=left_out, usage=usage(con))
