"""The metrics of a run, in one place, counted by DuckDB over the turns and their roles.

A metric must give a correct agent full marks, so each counts only the turns its question is
about (turn roles: analysis.episodes.roles):

- call fidelity (the headline): valid_call turns / `call` turns, whatever the surface the call
  came in: did the model produce a valid call when one was due?
- delivered fidelity: `call` turns whose valid call reached the harness as a call (in tool_calls,
  from the stack or from a condition, or a text call the harness parsed and acted on) / `call`
  turns. Call minus delivered is what the serving layer lost: calls left in text.
- restraint: `abstain` turns with no call attempt (on any surface) / `abstain` turns (items that
  expect no call): did the model hold back?
- delivered restraint: `abstain` turns where no call reached the harness / `abstain` turns: what
  the harness experienced, as a benchmark such as BFCL scores irrelevance. A call the model wrote
  in text that no parser extracted never reached it, so delivered restraint minus restraint is
  the calls the serving layer kept from the harness on items that wanted none.
- answer rate: episodes ending in an `answer` turn / episodes that had a call, answer or open turn.
- paper fidelity: valid_call turns / all produced turns, the definition of the study this project
  started from, kept so its tables can be reproduced. It counts a final answer as a miss.
- non-response rate: non_response turns / all turns, by cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import orjson

from toolproxy.analysis.classify.expectations import ExpectationRule, expectation
from toolproxy.analysis.classify.outcomes import ROLES
from toolproxy.analysis.episodes.roles import ROLE_SQL
from toolproxy.analysis.measure import stats
from toolproxy.analysis.store.state import stored_rules

METRICS = ("call_fidelity", "delivered_fidelity", "restraint", "delivered_restraint", "answer_rate", "paper_fidelity")

# Did a call of turn `t` reach the harness? The reply it got carried calls in tool_calls (the
# stack's, or a condition's: valid or not, the harness received them), or it acted on a valid call
# written in text (`delivered`, see analysis.episodes.roles.delivered). A call left in the reply text that
# the harness did not parse never reached it, valid or not. score() stores the answer per turn as
# `scored.reached`, the one definition the report's delivered restraint and compare's delivered
# verdict both read.
REACHED_HARNESS = (
    "(coalesce(t.delivered, false) or exists (select 1 from calls c "
    "where c.exchange_id = t.final_exchange_id and c.format = 'tool_calls'))"
)

# The task a turn belongs to (an episode's tree: analysis.episodes.links; the episode itself in a
# store derived before there were links), and whether it is a subagent's work: a task is
# answered by its own conversation, not by a subagent's answer to it.
_EPISODE_JOIN = "left join episodes ep on ep.episode_key = t.episode_key"
_TASK = "coalesce(ep.task_key, t.episode_key) as task_key, coalesce(ep.link = 'subagent', false) as subagent"

# Per task (an episode and its subagents' and compaction's): (numerator, denominator) of every
# metric, in one pass over the scored turns.
_EPISODE_COUNTS = """
select run, task_key,
       count(*) filter (where role = 'call' and outcome = 'valid_call') as call_k,
       count(*) filter (where role = 'call') as call_n,
       count(*) filter (where role = 'call' and delivered) as delivered_k,
       count(*) filter (where role = 'abstain' and outcome = 'prose') as restraint_k,
       count(*) filter (where role = 'abstain') as restraint_n,
       count(*) filter (where role = 'abstain' and not reached) as delivered_restraint_k,
       (count(*) filter (where role = 'answer' and not subagent) > 0)::int as answer_k,
       (count(*) filter (where role in ('call', 'answer', 'open')) > 0)::int as answer_n,
       count(*) filter (where outcome = 'valid_call') as paper_k,
       count(*) filter (where outcome <> 'non_response') as paper_n,
       count(*) filter (where outcome = 'non_response') as nonresp_k,
       count(*) as nonresp_n
from scored group by run, task_key order by run, task_key
"""
_COLUMNS = {
    "call_fidelity": ("call_k", "call_n"),
    "delivered_fidelity": ("delivered_k", "call_n"),
    "restraint": ("restraint_k", "restraint_n"),
    "delivered_restraint": ("delivered_restraint_k", "restraint_n"),
    "answer_rate": ("answer_k", "answer_n"),
    "paper_fidelity": ("paper_k", "paper_n"),
    "non_response_rate": ("nonresp_k", "nonresp_n"),
}


def score(con: duckdb.DuckDBPyConnection, runs: Sequence[str], rules: Sequence[ExpectationRule] = ()) -> None:
    """Create the temp tables `wanted` (the runs) and `scored` (their turns with expect, role, and
    `reached`: whether a call reached the harness, by REACHED_HARNESS).

    Without `rules` the roles are the stored ones. With them (an analyst's expectations given at
    report or compare time) each episode's expectation is recomputed from its tags under the
    stored rules followed by these, and the roles with it, by the same ROLE_SQL the analyzer uses.
    """
    con.execute("create or replace temp table wanted as select unnest(?::varchar[]) as run", [list(runs)])
    if not rules:
        con.execute(
            f"create or replace temp table scored as select t.* exclude (content), {REACHED_HARNESS} as reached, "
            f"{_TASK} from turns t {_EPISODE_JOIN} where t.run in (select run from wanted)"
        )
        return
    every = [*stored_rules(con), *rules]
    rows = con.execute(
        "select episode_key, tags::varchar from episodes where run in (select run from wanted)"
    ).fetchall()
    keys = [r[0] for r in rows]
    expects = [expectation(orjson.loads(r[1]) if r[1] else {}, every) for r in rows]
    con.execute(
        "create or replace temp table episode_expect as "
        "select unnest(?::varchar[]) as episode_key, unnest(?::varchar[]) as expect",
        [keys, expects],
    )
    con.execute(f"""
        create or replace temp table scored as
        select * exclude (role), {ROLE_SQL} as role from (
            select t.* exclude (expect, content), x.expect, {REACHED_HARNESS} as reached, {_TASK}
            from turns t left join episode_expect x using (episode_key) {_EPISODE_JOIN}
            where t.run in (select run from wanted))
    """)


@dataclass
class RunMetrics:
    call_fidelity: stats.Rate
    delivered_fidelity: stats.Rate
    restraint: stats.Rate
    delivered_restraint: stats.Rate
    answer_rate: stats.Rate
    paper_fidelity: stats.Rate
    non_response_rate: stats.Rate
    roles: dict[str, int]
    non_response_kinds: dict[str, int]
    non_response_retries: dict[str, int]


def by_run(rows: list[tuple], int_values: bool = True) -> dict[str, dict]:
    """(run, key, value) rows -> {run: {key: value}}, values as ints unless told otherwise."""
    out: dict[str, dict] = {}
    for run, key, n in rows:
        out.setdefault(run, {})[key] = int(n) if int_values else n
    return out


def run_metrics(
    con: duckdb.DuckDBPyConnection, runs: Sequence[str], resamples: int = stats.RESAMPLES, seed: int = 0
) -> dict[str, RunMetrics]:
    """Every metric of every run in `scored` (see score()); one grouped query per kind of count."""
    counts = con.execute(_EPISODE_COUNTS).fetchnumpy()
    roles = by_run(con.execute("select run, role, count(*) from scored where role is not null group by all").fetchall())
    kinds = by_run(
        con.execute("""
        select run, coalesce(sub_kind, 'unknown'), count(*) from scored where outcome = 'non_response' group by all
    """).fetchall()
    )
    retries = by_run(
        con.execute("""
        select run, coalesce(sub_kind, 'unknown'), sum(n_attempts - 1) from scored
        where outcome = 'non_response' and n_attempts > 1 group by all
    """).fetchall()
    )
    out = {}
    for run in runs:
        mask = counts["run"] == run
        rates = {
            name: stats.proportion(counts[k][mask], counts[n][mask], resamples=resamples, seed=seed)
            for name, (k, n) in _COLUMNS.items()
        }
        out[run] = RunMetrics(
            **rates,
            roles={r: roles.get(run, {}).get(r, 0) for r in ROLES},
            non_response_kinds=kinds.get(run, {}),
            non_response_retries=retries.get(run, {}),
        )
    return out
