"""Paired comparison of two runs over the same items: discordant counts and exact McNemar.

Items are paired by `item_key` (the explicit item tag, else the analyzer's hash of the first
request), so the test asks "on the same tasks, did B fail where A passed more often than the
reverse?" rather than comparing two rates that may cover different tasks.

When B is a replay of A (`toolproxy replay`), an item is a turn of A: each replayed turn is
judged on the question A's turn was asked (its role there: due a call, or expected to abstain),
and turns where either side got no response are counted apart, not as losses of either model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

import duckdb

from toolproxy.analysis.classify.expectations import ExpectationRule
from toolproxy.analysis.measure import stats
from toolproxy.analysis.measure.metrics import score
from toolproxy.analysis.measure.summary import StoreError, is_pattern, known_runs

# An item's verdict in one run, from the turns of its episode(s) in that run (repeats are pooled).
# Whether a call reached the harness is scored.reached (analysis.measure.metrics.REACHED_HARNESS), the
# same answer the report's delivered restraint counts.
METRICS = {
    "delivered": "case when expect_none then abstain_n > 0 and abstain_reached = 0 "
    "else call_n > 0 and call_delivered = call_n end",
    "call": "case when expect_none then abstain_n > 0 and abstain_tried = 0 "
    "else call_n > 0 and call_valid = call_n end",
    "all-valid": "produced > 0 and valid = produced",
    "any-valid": "valid > 0",
    "clean": "valid > 0 and failed = 0",
}
METRIC_HELP = {
    "delivered": "an item passes when every turn that was due a call delivered a valid call to the harness (in "
    "tool_calls, or a text call the harness acted on) and, for an item that expects no call, when no "
    "call reached the harness (a call left unparsed in the reply text did not); an item with neither "
    "kind of turn fails",
    "call": "like delivered, but judging the model whatever surface its call came in: a valid call in text the "
    "harness never saw counts, and so does a call attempted in text on an item that expects none",
    "all-valid": "an item passes when the model produced at least one turn and every produced turn is a valid_call "
    "(non-response turns are ignored; an item with only non-responses fails)",
    "any-valid": "an item passes when at least one turn is a valid_call",
    "clean": "an item passes when it made at least one valid call and no failed one (invalid arguments, "
    "hallucinated tool, unparseable call); prose turns such as an agent's final answer are allowed",
}
UNCATEGORIZED = "(none)"
# The metrics that judge an item by the turns its roles make due (a call, or an abstention).
ROLE_AWARE = ("delivered", "call")
# A replayed turn's verdict, given the role of the original turn it replays (see replay_verdicts).
# {o}/{d}/{r}: that side's outcome, its delivered flag, and whether a call reached the harness.
TURN_METRICS = {
    "delivered": "case when a.a_role = 'abstain' then not {r} else {o} = 'valid_call' and {d} end",
    "call": "case when a.a_role = 'abstain' then {o} = 'prose' else {o} = 'valid_call' end",
    "all-valid": "{o} = 'valid_call'",
    "any-valid": "{o} = 'valid_call'",
    "clean": "{o} = 'valid_call'",
}
# The turns of A that a metric asks about: the role-aware metrics only turns due a call or an abstention.
TURN_SCOPE = {"delivered": "a_role in ('call', 'abstain')", "call": "a_role in ('call', 'abstain')"}


@dataclass(frozen=True)
class Paired:
    """One 2x2 table of paired verdicts; b = A-only passes, c = B-only passes."""

    label: str
    paired: int
    both_pass: int
    a_only: int
    b_only: int
    both_fail: int
    p: float
    p_holm: float | None = None


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    metric: str
    only_in_a: int
    only_in_b: int
    overall: Paired
    categories: list[Paired]
    # Set when B replays A's turns: why turns were left out of the pairing, with counts.
    replay: bool = False
    left_out: dict[str, int] | None = None
    # Of the paired items, per side: the episodes they pool (an item's repeats are judged together),
    # and, under a role-aware metric, the items with no turn it scores (none due a call, or none
    # abstaining where no call was expected), which fail: why "both fail" can be most items.
    episodes: tuple[int, int] | None = None
    unscored: tuple[int, int] | None = None
    # Each side's headline over its turns, as the report prints it (set by the command for a side
    # that is one run, not a pattern): the number a reader compares before the items.
    headlines: dict[str, str] | None = None


def _paired(label: str, paired: int, both_pass: int, a_only: int, b_only: int) -> Paired:
    return Paired(
        label,
        paired,
        both_pass,
        a_only,
        b_only,
        paired - both_pass - a_only - b_only,
        stats.mcnemar_exact(a_only, b_only),
    )


def compare(
    con: duckdb.DuckDBPyConnection,
    run_a: str,
    run_b: str,
    metric: str = "delivered",
    by_category: bool = False,
    rules: Sequence[ExpectationRule] = (),
) -> Comparison:
    """A against B; either may be a wildcard pattern (`bfcl-*-native`) that pools every run it matches.

    Pooling is how a study split into several runs (one per category, say) gets one paired answer
    per condition: an item keeps its own verdict, so each matched run's items simply join the pairs.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    if run_a == run_b:
        raise StoreError(f"compare needs two different runs, got {run_a!r} twice")
    side_a, side_b = _side(con, run_a), _side(con, run_b)
    shared = sorted(set(side_a) & set(side_b))
    if shared:
        raise StoreError(
            f"compare needs two different sets of runs; both {run_a!r} and {run_b!r} include {', '.join(shared)}"
        )
    score(con, [*side_a, *side_b], rules)
    if len(side_a) == len(side_b) == 1 and is_replay(con, side_a[0], side_b[0]):
        return replay_compare(con, side_a[0], side_b[0], metric, by_category)
    verdict = METRICS[metric]
    con.execute(
        f"""
        create or replace temp table verdicts as
        with item as (
            select case when list_contains($a, e.run) then 'a' else 'b' end as side, e.item_key,
                   coalesce(any_value(e.category), any_value(t.category)) as category,
                   count(t.turn_id) filter (where t.outcome <> 'non_response') as produced,
                   count(t.turn_id) filter (where t.outcome = 'valid_call') as valid,
                   count(t.turn_id) filter (where t.outcome in ('invalid_args', 'hallucinated_call',
                       'unparseable')) as failed,
                   count(t.turn_id) filter (where t.role = 'call') as call_n,
                   count(t.turn_id) filter (where t.role = 'call' and t.outcome = 'valid_call') as call_valid,
                   count(t.turn_id) filter (where t.role = 'call' and t.delivered) as call_delivered,
                   count(t.turn_id) filter (where t.role = 'abstain') as abstain_n,
                   count(t.turn_id) filter (where t.role = 'abstain' and t.outcome <> 'prose') as abstain_tried,
                   count(t.turn_id) filter (where t.role = 'abstain' and t.reached) as abstain_reached,
                   coalesce(bool_or(t.expect = 'none'), false) as expect_none,
                   count(distinct e.episode_key) as episodes
            from episodes e left join scored t on t.episode_key = e.episode_key
            where (list_contains($a, e.run) or list_contains($b, e.run)) and e.item_key is not null
            group by side, e.item_key
        )
        select item_key, side, category, {verdict} as pass, episodes,
               case when expect_none then abstain_n = 0 else call_n = 0 end as unscored
        from item
    """,
        {"a": side_a, "b": side_b},
    )
    only_a, only_b = con.execute("""
        select count(*) filter (where side = 'a'), count(*) filter (where side = 'b') from verdicts v
        where (select count(distinct side) from verdicts w where w.item_key = v.item_key) = 1
    """).fetchone()
    rows = con.execute(
        """
        with pairs as (
            select a.item_key, coalesce(a.category, b.category, $none) as category, a.pass as pa, b.pass as pb
            from verdicts a join verdicts b on a.item_key = b.item_key and a.side = 'a' and b.side = 'b'
        )
        select category, count(*), count(*) filter (where pa and pb), count(*) filter (where pa and not pb),
               count(*) filter (where pb and not pa)
        from pairs group by category order by category
    """,
        {"none": UNCATEGORIZED},
    ).fetchall()
    if not rows:
        raise StoreError(
            f"no item is present in both {run_a} ({only_a} items) and {run_b} ({only_b} items): "
            "items are paired by item_key (tag episodes with the same item in both runs)"
        )
    overall, categories = _tables(rows, by_category)
    ep_a, ep_b, un_a, un_b = con.execute("""
        select sum(episodes) filter (where side = 'a'), sum(episodes) filter (where side = 'b'),
               count(*) filter (where side = 'a' and unscored), count(*) filter (where side = 'b' and unscored)
        from verdicts v
        where (select count(distinct side) from verdicts w where w.item_key = v.item_key) = 2
    """).fetchone()
    result = Comparison(run_a, run_b, metric, int(only_a), int(only_b), overall, categories)
    return replace(
        result,
        episodes=(int(ep_a or 0), int(ep_b or 0)),
        unscored=(int(un_a), int(un_b)) if metric in ROLE_AWARE else None,
    )


def _side(con: duckdb.DuckDBPyConnection, run: str) -> list[str]:
    """The runs one side of a comparison stands for: the run itself, or every run a pattern matches."""
    if not is_pattern(run):
        return [run]
    matched = [r for r in known_runs(con) if fnmatchcase(r, run)]
    if not matched:
        raise StoreError(f"no run matches {run!r}")
    return matched


def _tables(rows: list[tuple], by_category: bool) -> tuple[Paired, list[Paired]]:
    totals = [sum(r[i] for r in rows) for i in range(1, 5)]
    categories = []
    if by_category:
        raw = [_paired(*r) for r in rows]
        adjusted = stats.holm([c.p for c in raw])
        categories = [replace(c, p_holm=h) for c, h in zip(raw, adjusted)]
    return _paired("all", *totals), categories


def is_replay(con: duckdb.DuckDBPyConnection, run_a: str, run_b: str) -> bool:
    """True when B's exchanges were replayed from A's turns."""
    return con.execute(
        "select exists (select 1 from exchanges where run = $b and tags->>'replay_of_run' = $a)",
        {"a": run_a, "b": run_b},
    ).fetchone()[0]


def replay_compare(
    con: duckdb.DuckDBPyConnection, run_a: str, run_b: str, metric: str, by_category: bool
) -> Comparison:
    """B replays A's turns: pair turn by turn, each judged on A's turn's question.

    A turn where either side got no response says nothing about either model (a refusing launch,
    a timeout), so it is counted by cause and left out of the test, never scored as a loss.
    """
    scope = TURN_SCOPE.get(metric, "true")
    verdict = TURN_METRICS[metric]
    con.execute(
        f"""
        create or replace temp table replay_pairs as
        with a as (
            select turn_id, coalesce(category, $none) as category, role as a_role, outcome, delivered, sub_kind, reached
            from scored where run = $a
        ), b as (
            select item_key as turn_id, arg_max(outcome, turn_index) as outcome, arg_max(delivered, turn_index) as
                delivered,
                   arg_max(sub_kind, turn_index) as sub_kind, arg_max(reached, turn_index) as reached
            from scored where run = $b and item_key is not null group by item_key
        )
        select a.turn_id, a.category, a.a_role, a.outcome as a_outcome, a.sub_kind as a_kind,
               b.outcome as b_outcome, b.sub_kind as b_kind,
               coalesce({verdict.format(o="a.outcome", d="a.delivered", r="a.reached")}, false) as pa,
               coalesce({verdict.format(o="b.outcome", d="b.delivered", r="b.reached")}, false) as pb
        from a join b using (turn_id)
    """,
        {"a": run_a, "b": run_b, "none": UNCATEGORIZED},
    )
    left = con.execute(f"""
        select why, count(*) from (
            select case when a_outcome = 'non_response' then 'no response in A: ' || coalesce(a_kind, 'unknown')
                        when b_outcome = 'non_response' then 'no response in B: ' || coalesce(b_kind, 'unknown')
                        when not ({scope}) then 'not due a call or an abstention in A (role ' || coalesce(a_role,
                            '-') || ')'
                   end as why
            from replay_pairs) where why is not null group by why order by why
    """).fetchall()
    rows = con.execute(f"""
        select category, count(*), count(*) filter (where pa and pb), count(*) filter (where pa and not pb),
               count(*) filter (where pb and not pa)
        from replay_pairs
        where a_outcome <> 'non_response' and b_outcome <> 'non_response' and ({scope})
        group by category order by category
    """).fetchall()
    only_a, only_b = con.execute(
        """
        select (select count(*) from scored where run = $a and turn_id not in (select turn_id from replay_pairs)),
               (select count(distinct item_key) from scored where run = $b
                and item_key not in (select turn_id from replay_pairs))
    """,
        {"a": run_a, "b": run_b},
    ).fetchone()
    overall, categories = _tables(rows, by_category) if rows else (_paired("all", 0, 0, 0, 0), [])
    return Comparison(
        run_a,
        run_b,
        metric,
        int(only_a),
        int(only_b),
        overall,
        categories,
        replay=True,
        left_out={why: int(n) for why, n in left},
    )
