"""One row of numbers per run, read from the analyzed DuckDB store.

DuckDB does the counting (it is built for it and the store can be larger than memory); numpy only
draws the bootstrap. What comes out is plain dataclasses that every renderer shares, so the
terminal table, the JSON and the HTML chart can never disagree about a number.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import duckdb

from analysis import stats
from analysis.outcomes import HALLUCINATED, INVALID_ARGS, NON_RESPONSE, PROSE, SUB_KINDS, UNPARSEABLE, VALID_CALL
from analysis.store import StoreError
from toolproxy import __version__

# Display order: the good outcome first, non-responses last.
OUTCOMES = (VALID_CALL, INVALID_ARGS, HALLUCINATED, UNPARSEABLE, PROSE, NON_RESPONSE)
NON_RESPONSE_KINDS = SUB_KINDS


def known_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run the store knows, from the runs table and from turns (a run is never silently lost)."""
    rows = con.execute("select run from runs union select run from turns order by 1").fetchall()
    return [r[0] for r in rows if r[0] is not None]


def select_runs(con: duckdb.DuckDBPyConnection, wanted: Sequence[str] | None, path: Path) -> list[str]:
    """The runs to report, checked against the store so a typo is named, not reported as empty."""
    runs = known_runs(con)
    if not runs:
        raise StoreError(f"{path} holds no runs yet: record some traffic, then run `toolproxy analyze`")
    if not wanted:
        return runs
    unknown = [r for r in wanted if r not in runs]
    if unknown:
        raise StoreError(f"unknown run(s): {', '.join(unknown)}; runs in {path}: {', '.join(runs)}")
    return list(dict.fromkeys(wanted))


@dataclass
class RunSummary:
    run: str
    stack: str | None
    stack_version: str | None
    model: str | None
    condition: str | None
    turns: int
    episodes: int
    fidelity: stats.Fidelity
    outcomes: dict[str, int]
    non_response_kinds: dict[str, int]
    calls: int
    text_calls: int
    harness_saw_prose: int
    valid_seen_as_prose: int
    looping_episodes: int

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
        """Every turn was a non-response: fidelity is undefined, the model never answered."""
        return self.turns > 0 and self.fidelity.produced == 0


@dataclass
class Report:
    runs: list[RunSummary]
    source: str
    seed: int
    resamples: int
    toolproxy_version: str = __version__
    generated_at: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))


def _by_run(rows: list[tuple]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for run, key, n in rows:
        out.setdefault(run, {})[key] = int(n)
    return out


def summarize(con: duckdb.DuckDBPyConnection, runs: Sequence[str], source: str, seed: int = 0,
              resamples: int = stats.RESAMPLES) -> Report:
    """Aggregate the chosen runs; each query groups by run once rather than looping over runs."""
    con.execute("create or replace temp table wanted as select unnest(?::varchar[]) as run", [list(runs)])
    meta = {r[0]: r[1:] for r in con.execute("""
        select w.run, r.stack, r.stack_version,
               coalesce(r.model, t.model), coalesce(r.condition, t.condition)
        from wanted w
        left join runs r using (run)
        left join (select run, any_value(model) as model, any_value(condition) as condition
                   from turns group by run) t using (run)
    """).fetchall()}
    outcomes = _by_run(con.execute(
        "select run, outcome, count(*) from turns where run in (select run from wanted) group by all").fetchall())
    kinds = _by_run(con.execute("""
        select run, coalesce(sub_kind, 'unknown'), count(*) from turns
        where outcome = 'non_response' and run in (select run from wanted) group by all
    """).fetchall())
    per_turn = {r[0]: r[1:] for r in con.execute("""
        select run, count(*), count(*) filter (where harness_saw_prose),
               count(*) filter (where harness_saw_prose and outcome = 'valid_call')
        from turns
        where run in (select run from wanted) group by run
    """).fetchall()}
    per_call = {r[0]: r[1:] for r in con.execute("""
        select t.run, count(*), count(*) filter (where c.surface = 'text')
        from calls c join turns t using (turn_id)
        where t.run in (select run from wanted) group by t.run
    """).fetchall()}
    per_episode = {r[0]: r[1:] for r in con.execute("""
        select run, count(*), count(*) filter (where looping) from episodes
        where run in (select run from wanted) group by run
    """).fetchall()}
    counts = con.execute("""
        select run,
               count(*) filter (where outcome = 'valid_call') as valid,
               count(*) filter (where outcome <> 'non_response') as produced,
               count(*) filter (where outcome = 'non_response') as non_responses
        from turns where run in (select run from wanted)
        group by run, episode_key order by run, episode_key
    """).fetchnumpy()

    summaries = []
    for run in runs:
        mask = counts["run"] == run
        fid = stats.fidelity(counts["valid"][mask], counts["produced"][mask], counts["non_responses"][mask],
                             resamples=resamples, seed=seed)
        stack, version, model, condition = meta.get(run, (None, None, None, None))
        turns, saw_prose, valid_prose = per_turn.get(run, (0, 0, 0))
        calls, text_calls = per_call.get(run, (0, 0))
        episodes, looping = per_episode.get(run, (int(mask.sum()), 0))
        summaries.append(RunSummary(
            run=run, stack=stack, stack_version=version, model=model, condition=condition,
            turns=int(turns), episodes=int(episodes), fidelity=fid,
            outcomes={k: 0 for k in OUTCOMES} | outcomes.get(run, {}),
            non_response_kinds=kinds.get(run, {}),
            calls=int(calls), text_calls=int(text_calls), harness_saw_prose=int(saw_prose),
            valid_seen_as_prose=int(valid_prose), looping_episodes=int(looping),
        ))
    return Report(runs=summaries, source=source, seed=seed, resamples=resamples)
