"""One row of numbers per run, read from the analyzed DuckDB store.

DuckDB does the counting (it is built for it and the store can be larger than memory); numpy only
draws the bootstrap; the metrics themselves are defined in analysis.measure.metrics. What comes out is
plain dataclasses that every renderer shares, so the terminal table, the JSON and the HTML chart
can never disagree about a number.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from fnmatch import fnmatchcase
from pathlib import Path

import duckdb

from toolproxy import __version__
from toolproxy.analysis.classify.expectations import ExpectationRule
from toolproxy.analysis.classify.outcomes import (
    ANALYZER_VERSION,
    HALLUCINATED,
    INVALID_ARGS,
    NON_RESPONSE,
    PROSE,
    SUB_KINDS,
    UNPARSEABLE,
    VALID_CALL,
)
from toolproxy.analysis.measure import stats
from toolproxy.analysis.measure.metrics import RunMetrics, by_run, run_metrics, score
from toolproxy.analysis.store.connection import StoreError
from toolproxy.analysis.store.state import stored_version

# Display order: the good outcome first, non-responses last.
OUTCOMES = (VALID_CALL, INVALID_ARGS, HALLUCINATED, UNPARSEABLE, PROSE, NON_RESPONSE)
NON_RESPONSE_KINDS = SUB_KINDS


def known_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run the store knows, from the runs table and from turns (a run is never silently lost)."""
    rows = con.execute("select run from runs union select run from turns order by 1").fetchall()
    return [r[0] for r in rows if r[0] is not None]


def is_pattern(name: str) -> bool:
    """A run name with shell-style wildcards (`bfcl-*-native`) stands for every run it matches."""
    return any(c in name for c in "*?[")


def select_runs(con: duckdb.DuckDBPyConnection, wanted: Sequence[str] | None, path: Path) -> list[str]:
    """The runs to report, checked against the store so a typo is named, not reported as empty.

    A wanted name with wildcards expands to the matching runs (in store order); one that matches
    nothing is an error like an unknown name, since an empty selection would report nothing.
    """
    runs = known_runs(con)
    if not runs:
        raise StoreError(f"{path} holds no runs yet: record some traffic, then run `toolproxy analyze`")
    if not wanted:
        return runs
    chosen = {r: [run for run in runs if fnmatchcase(run, r)] if is_pattern(r) else [r] * (r in runs) for r in wanted}
    unknown = [r for r, matched in chosen.items() if not matched]
    if unknown:
        raise StoreError(f"unknown run(s): {', '.join(unknown)}; runs in {path}: {', '.join(runs)}")
    return list(dict.fromkeys(run for matched in chosen.values() for run in matched))


@dataclass
class Sampling:
    """A run recorded with `--sample`: counts above are of the kept episodes; these are the totals
    they stand for (each turn weighed by 1/its rate). Rates need no scaling: they are estimates
    from the kept episodes as they are."""

    rate_min: float
    rate_max: float
    estimated_turns: float
    estimated_episodes: float
    exchanges_not_stored: int


_SAMPLING_SQL = """
with t as (
    select t.run, t.turn_index,
           coalesce(try_cast(json_extract(e.record, '$.extra.sample.rate') as double), 1.0) as rate
    from turns t join exchanges e on e.id = t.final_exchange_id
    where t.run in (select run from wanted)
), kept as (
    select run, min(rate) as lo, max(rate) as hi, sum(1 / rate) as turns,
           coalesce(sum(1 / rate) filter (where turn_index = 0), 0) as episodes
    from t group by run
), dropped as (
    select run, count(*) as n from exchanges
    where kind = 'sampled_out' and run in (select run from wanted) group by run
)
select run, coalesce(lo, 1.0), coalesce(hi, 1.0), coalesce(turns, 0), coalesce(episodes, 0), coalesce(n, 0)
from kept full join dropped using (run)
where coalesce(lo, 1.0) < 1 or coalesce(n, 0) > 0
"""


def sampling_by_run(con: duckdb.DuckDBPyConnection) -> dict[str, Sampling]:
    """The sampled runs among `wanted`: their rates and estimated totals."""
    return {r[0]: Sampling(*r[1:3], float(r[3]), float(r[4]), int(r[5])) for r in con.execute(_SAMPLING_SQL).fetchall()}


@dataclass
class RunSummary(RunMetrics):
    """A run's metrics (analysis.measure.metrics) and what a reader needs beside them."""

    run: str
    stack: str | None
    stack_version: str | None
    model: str | None
    condition: str | None
    turns: int
    episodes: int
    outcomes: dict[str, int]
    calls: int
    text_calls: int
    harness_saw_prose: int
    valid_seen_as_prose: int
    looping_episodes: int
    # episodes a task's own (analysis.episodes.links): subagents' episodes and the episodes of a
    # task that went on after a compaction, counted in `episodes` once, as their task
    subagent_episodes: int = 0
    compactions: int = 0
    # what the harness asked for itself beside its tasks, by kind (analysis.classify.sides): no turn
    side_requests: dict[str, int] = field(default_factory=dict)
    # requests alone in an episode, offering no tools, beside tasks that offer tools: side requests
    # toolproxy does not know, most likely (never left out of the counts: said)
    unplaced: int = 0
    # medians over the run's attempts that got a first token: time to first byte and to first token
    # (keep-alive comments before a token are bytes, not tokens: analysis.classify.firsttoken)
    ttfb_median_ms: float | None = None
    ttft_median_ms: float | None = None
    replay_of: str | None = None  # the run whose turns this run replays (toolproxy replay)
    sampling: Sampling | None = None  # recorded with `serve --sample`: the rate and estimated totals
    # Per non-response cause, what the record said of its latest turn (the stack's error message,
    # or the analyzer's why): "refused" -> "tools param requires --jinja flag".
    non_response_causes: dict[str, str] = field(default_factory=dict)

    @property
    def outcome_shares(self) -> dict[str, float | None]:
        """Share of every outcome among all turns, non-responses included (the stacked bar)."""
        return {k: stats.rate(v, self.turns) for k, v in self.outcomes.items()}

    @property
    def surfaced_as_text(self) -> float | None:
        """Share of calls found in the text rather than in tool_calls: the parser-not-configured signature."""
        return stats.rate(self.text_calls, self.calls)

    @property
    def rejected(self) -> bool:
        """Every turn was a non-response: no metric is defined, the model's output never arrived."""
        return self.turns > 0 and self.paper_fidelity.denominator == 0

    @property
    def lost_in_serving(self) -> float | None:
        """Call fidelity minus delivered fidelity: valid calls the harness never got as calls."""
        call, delivered = self.call_fidelity.pooled, self.delivered_fidelity.pooled
        return None if call is None or delivered is None else call - delivered


@dataclass
class Report:
    runs: list[RunSummary]
    source: str
    seed: int
    resamples: int
    analyzer_version: int | None
    expect_rules: list[str] = field(default_factory=list)
    toolproxy_version: str = __version__
    generated_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))

    @property
    def stale(self) -> bool:
        """The store was analysed under other rules than this toolproxy's; `analyze` rebuilds it."""
        return self.analyzer_version != ANALYZER_VERSION


# Per run, the episodes of one turn that offered no tools, where other turns of the run did: a
# request beside the tasks that the side-request table does not know.
UNPLACED_SQL = """
select s.run, count(*) from scored s join episodes e on e.episode_key = s.episode_key
where e.n_turns = 1 and not coalesce(s.offered_tools, false) and s.task_key = s.episode_key
  and exists (select 1 from scored o where o.run = s.run and o.offered_tools)
group by s.run
"""


def summarize(
    con: duckdb.DuckDBPyConnection,
    runs: Sequence[str],
    source: str,
    seed: int = 0,
    resamples: int = stats.RESAMPLES,
    rules: Sequence[ExpectationRule] = (),
) -> Report:
    """Aggregate the chosen runs; each query groups by run once rather than looping over runs.

    `rules`: expectation rules for this report only (see analysis.measure.metrics.score).
    """
    score(con, runs, rules)
    meta = {
        r[0]: r[1:]
        for r in con.execute("""
        select w.run, r.stack, r.stack_version,
               coalesce(r.model, t.model), coalesce(r.condition, t.condition)
        from wanted w
        left join runs r using (run)
        left join (select run, any_value(model) as model, any_value(condition) as condition
                   from turns group by run) t using (run)
    """).fetchall()
    }
    outcomes = by_run(con.execute("select run, outcome, count(*) from scored group by all").fetchall())
    per_turn = {
        r[0]: r[1:]
        for r in con.execute("""
        select run, count(*), count(*) filter (where harness_saw_prose),
               count(*) filter (where harness_saw_prose and outcome = 'valid_call')
        from scored group by run
    """).fetchall()
    }
    per_call = {
        r[0]: r[1:]
        for r in con.execute("""
        select t.run, count(*), count(*) filter (where c.surface = 'text')
        from calls c join scored t using (turn_id) group by t.run
    """).fetchall()
    }
    per_episode = {
        r[0]: r[1:]
        for r in con.execute("""
        select run, count(*) filter (where task_key is null or task_key = episode_key), count(*) filter (where looping),
               count(*) filter (where link = 'subagent'), count(*) filter (where link = 'compaction') from episodes
        where run in (select run from wanted) group by run
    """).fetchall()
    }
    sides = by_run(
        con.execute("""
        select run, side_request, count(*) from exchanges
        where run in (select run from wanted) and side_request is not null group by all
    """).fetchall()
    )
    unplaced = dict(con.execute(UNPLACED_SQL).fetchall())
    timing = {
        r[0]: r[1:]
        for r in con.execute("""
        select run, median(ttfb_ms), median(ttft_ms) from exchanges
        where run in (select run from wanted) and is_attempt and ttft_ms is not null group by run
    """).fetchall()
    }
    replays = dict(
        con.execute("""
        select run, any_value(tags->>'replay_of_run') from exchanges
        where run in (select run from wanted) and tags->>'replay_of_run' is not null group by run
    """).fetchall()
    )
    metrics = run_metrics(con, runs, resamples=resamples, seed=seed)
    sampled = sampling_by_run(con)
    causes = by_run(
        con.execute("""
        select t.run, t.sub_kind, arg_max(json_extract_string(e.record, '$.classification_detail'), e.started_at)
        from scored t join exchanges e on e.id = t.final_exchange_id
        where t.outcome = 'non_response' and t.sub_kind is not null group by all
    """).fetchall(),
        int_values=False,
    )

    summaries = []
    for run in runs:
        m: RunMetrics = metrics[run]
        stack, version, model, condition = meta.get(run, (None, None, None, None))
        turns, saw_prose, valid_prose = per_turn.get(run, (0, 0, 0))
        calls, text_calls = per_call.get(run, (0, 0))
        episodes, looping, subagents, compactions = per_episode.get(run, (0, 0, 0, 0))
        summaries.append(
            RunSummary(
                **{f.name: getattr(m, f.name) for f in fields(RunMetrics)},
                run=run,
                stack=stack,
                stack_version=version,
                model=model,
                condition=condition,
                turns=int(turns),
                episodes=int(episodes),
                outcomes={k: 0 for k in OUTCOMES} | outcomes.get(run, {}),
                calls=int(calls),
                text_calls=int(text_calls),
                harness_saw_prose=int(saw_prose),
                valid_seen_as_prose=int(valid_prose),
                looping_episodes=int(looping),
                replay_of=replays.get(run),
                subagent_episodes=int(subagents),
                compactions=int(compactions),
                side_requests=sides.get(run, {}),
                unplaced=int(unplaced.get(run, 0)),
                ttfb_median_ms=timing.get(run, (None, None))[0],
                ttft_median_ms=timing.get(run, (None, None))[1],
                sampling=sampled.get(run),
                non_response_causes={k: v for k, v in causes.get(run, {}).items() if v},
            )
        )
    return Report(
        runs=summaries,
        source=source,
        seed=seed,
        resamples=resamples,
        analyzer_version=stored_version(con),
        expect_rules=[str(r) for r in rules],
    )
