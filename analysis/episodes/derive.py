"""The turns, episodes and runs tables derived in DuckDB from the stored exchanges.

Python does only what is sequential (grouping attempts into turns and episodes, loops,
expectations); statements run per batch of runs, and what a turn copies from its final attempt is
joined in SQL. After an ingest, derive_changes derives again only the tagged episodes that gained
attempts and the conversations new untagged attempts join, where that gives what deriving their
whole runs would.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Iterator, Sequence

import orjson

from toolproxy.analysis.classify.expectations import ExpectationRule
from toolproxy.analysis.classify.keys import link_map, parent_walk, request_key
from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.analysis.episodes.build import build_episodes, category_of, episode_expectation
from toolproxy.analysis.episodes.links import link_episodes
from toolproxy.analysis.episodes.loops import rejudged
from toolproxy.analysis.episodes.model import Attempt, Episode
from toolproxy.analysis.episodes.roles import ROLE_SQL, TurnFacts, turn_facts
from toolproxy.analysis.store.columns import share_strings
from toolproxy.analysis.store.connection import insert_columns
from toolproxy.analysis.store.state import set_unfinished_runs, stored_rules, unfinished_runs
from toolproxy.analysis.store.tables import EPISODE_KEYS, EPISODES, TURNS
from toolproxy.record.segments import SEGMENT_REPLICA
from toolproxy.runtime.gcpause import gc_paused

# One fetch of many runs' attempts (runs are batched up to about this many attempts) instead of a
# query per run: a run's query scans the whole table, and building rows out of it is per-row work.
# A batch is held whole while grouped (about 1.6 KB per untagged attempt in Python): deriving 100k
# exchanges in 30 daily runs peaked at 566-610 MB in batches of 200k attempts, 498-505 MB in batches
# of 50k, at the same CPU (in one process on the same database, `--mix daily`).
_BATCH_ATTEMPTS = 50_000

# Per run: its attempts, how many replicas (hosts, so clocks) recorded them, from their segments'
# names, and how many of its untagged attempts have conversation keys but no thread (see _batches).
_RUN_SIZES_SQL = """
SELECT run, sum(n), count(DISTINCT regexp_extract(segment, $pattern, 1)), sum(loose)
FROM (SELECT run, segment, count(*) AS n,
             count(*) FILTER (WHERE episode IS NULL AND state_hash IS NOT NULL AND thread IS NULL) AS loose
      FROM exchanges WHERE is_attempt AND run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run, segment)
GROUP BY run
"""
# The part of its run an attempt is grouped with: a tagged attempt's episode, an untagged one's
# thread (keys.thread_key), and untagged attempts without conversation keys, which name and are
# named by none, together. No attempt continues or retries one of another part.
_PART_SQL = "CASE WHEN episode IS NOT NULL THEN 'e' || episode WHEN state_hash IS NULL THEN 'i' ELSE 't' || thread END"
_PARTS_SQL = f"""
SELECT run, {_PART_SQL} AS part, count(*) FROM exchanges
WHERE is_attempt AND run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY ALL ORDER BY run, part
"""

# The attempts of a batch of runs, in clock order per run, column by column (see Attempt). The key
# lists come as one space-separated string each (hex hashes), which is much cheaper to fetch than a
# list, and they and prior_hash only where build_episodes reads them: untagged attempts, and every
# attempt of a run several clocks recorded (causal_order).
_ATTEMPT_SELECT = """run, id, episode, item, json_extract_string(tags, '$.category'), condition, outcome, sub_kind,
       coalesce(harness_saw_prose, false), state_hash, chain_hash,
       CASE WHEN episode IS NULL OR run IN (SELECT unnest($clocks::VARCHAR[]))
            THEN array_to_string(coalesce(parent_hashes, []), ' ') END,
       item_hash, call_signature, tags::VARCHAR, coalesce(tool_results, 0),
       CASE WHEN episode IS NULL OR run IN (SELECT unnest($clocks::VARCHAR[]))
            THEN array_to_string(coalesce(reply_keys, []), ' ') END,
       coalesce(rejects, false), tool_set IS NOT NULL,
       CASE WHEN episode IS NULL OR run IN (SELECT unnest($clocks::VARCHAR[])) THEN prior_hash END,
       CASE WHEN episode IS NULL OR run IN (SELECT unnest($clocks::VARCHAR[]))
            THEN array_to_string(coalesce(prefix_links, []), ' ') END,
       epoch(started_at), epoch(ended_at), CASE WHEN episode IS NULL THEN thread END"""
_ATTEMPT_COLUMNS_SQL = f"SELECT {_ATTEMPT_SELECT}\nFROM exchanges\n"
# The attempts of runs that fit one batch (so whole, all their parts in it).
_ATTEMPTS_SQL = (
    _ATTEMPT_COLUMNS_SQL + "WHERE is_attempt AND run IN (SELECT unnest($runs::VARCHAR[])) ORDER BY run, started_at, id"
)
# Several batches: every batch's attempts sorted once into a temporary table (which spills under the
# memory limit), each then read by its number: a query per batch would scan the runs' exchanges once
# per batch, which is the square of the run.
_BATCHED_SQL = f"""
CREATE OR REPLACE TEMP TABLE _batched AS
SELECT b.batch, {_ATTEMPT_SELECT}, started_at AS _t
FROM exchanges JOIN _part_batch b
  ON b.prun = run AND b.ppart = CASE WHEN list_contains($whole::VARCHAR[], run) THEN '' ELSE {_PART_SQL} END
WHERE is_attempt AND run IN (SELECT prun FROM _part_batch)
ORDER BY b.batch, run, started_at, id
"""
_BATCH_SQL = "SELECT * EXCLUDE (batch, _t) FROM _batched WHERE batch = $batch ORDER BY run, _t, id"
# The attempts of some tagged episodes of one run (_derive_in_part).
_EPISODE_ATTEMPTS_SQL = (
    _ATTEMPT_COLUMNS_SQL + "WHERE is_attempt AND run = $run AND episode IN (SELECT unnest($episodes::VARCHAR[])) "
    "ORDER BY run, started_at, id"
)

# _ATTEMPTS_SQL's columns are run, then Attempt's fields in order; the key lists come as one string each.
_KEY_LISTS = [
    1 + [f.name for f in dataclasses.fields(Attempt)].index(name)
    for name in ("parent_hashes", "reply_keys", "prefix_links")
]

# What derive() computes of a turn in Python; the rest (_TURNS_SQL) is its final attempt's.
_TURN_ROW = [
    "turn_id",
    "run",
    "episode_key",
    "turn_index",
    "item_key",
    "category",
    "n_attempts",
    "final_exchange_id",
    "expect",
    *TurnFacts._fields,
]
_FROM_FINAL = {
    "condition": "e.condition",
    "model": "e.model",
    "outcome": "e.outcome",
    "sub_kind": "e.sub_kind",
    "surface": "e.surface",
    "n_calls": "coalesce(e.n_calls, 0)",
    "finish_reason": "e.finish_reason",
    "harness_saw_prose": "coalesce(e.harness_saw_prose, false)",
    "content": "e.content",
    "offered_tools": "e.tool_set IS NOT NULL",
    "tool_results": "coalesce(e.tool_results, 0)",
    "finishes": "coalesce(e.finishes, false)",
    "protocol": "e.protocol",
    "finisher": "e.finisher",
}
_TURN_SELECT = ", ".join(
    f"({ROLE_SQL})" if n == "role" else "$version" if n == "analyzer_version" else n for n in TURNS.names
)
_TURNS_SQL = f"""
INSERT INTO turns ({", ".join(TURNS.names)})
SELECT {_TURN_SELECT}
FROM (SELECT {", ".join(f"t.{n}" for n in _TURN_ROW)}, {", ".join(f"{sql} AS {n}" for n, sql in _FROM_FINAL.items())}
      FROM _turn_rows t JOIN exchanges e ON e.id = t.final_exchange_id WHERE e.id BETWEEN $lo AND $hi ORDER BY t.rowid)
"""
assert set(_TURN_ROW) | set(_FROM_FINAL) | {"role", "analyzer_version"} == set(TURNS.names)
# Per run of $runs, its exchanges' count and times (aggregated for the runs of $whole; _run_totals holds the
# others', which a re-analyze counted in part, _count_new), its most common model, marker and upstream (the
# greatest count, then the least value, from run_tallies) and its conditions. Its stack is the latest
# fingerprint's of the run, else of its upstream, read only for these runs and upstreams: the fingerprints
# of every run would be aggregated on each re-analyze.
_RUNS_SQL = """
INSERT INTO runs
WITH totals AS (
    SELECT * FROM _run_totals
    UNION ALL
    SELECT run, count(*), min(started_at), max(coalesce(ended_at, started_at))
    FROM exchanges WHERE run IN (SELECT unnest($whole::VARCHAR[])) GROUP BY run
),
modes AS (
    SELECT run,
           first(value ORDER BY n DESC, value) FILTER (WHERE field = 'model') AS model,
           string_agg(value, ',' ORDER BY value) FILTER (WHERE field = 'condition') AS condition,
           first(value ORDER BY n DESC, value) FILTER (WHERE field = 'marker') AS marker,
           first(value ORDER BY n DESC, value) FILTER (WHERE field = 'marker_version') AS marker_version,
           first(value ORDER BY n DESC, value) FILTER (WHERE field = 'upstream') AS upstream
    FROM run_tallies WHERE run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run
),
ex AS (SELECT totals.*, modes.* EXCLUDE (run) FROM totals LEFT JOIN modes USING (run)),
fp_run AS (
    SELECT run, arg_max(stack, recorded_at) AS stack, arg_max(stack_version, recorded_at) AS version
    FROM fingerprints WHERE run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run
),
fp_up AS (
    SELECT upstream, arg_max(stack, recorded_at) AS stack, arg_max(stack_version, recorded_at) AS version
    FROM fingerprints WHERE upstream IN (SELECT upstream FROM ex) GROUP BY upstream
)
SELECT ex.run,
       coalesce(fp_run.stack, fp_up.stack, ex.marker),
       CASE WHEN fp_run.stack IS NOT NULL THEN fp_run.version
            WHEN fp_up.stack IS NOT NULL THEN fp_up.version
            ELSE ex.marker_version END,
       ex.model, ex.condition, ex.n_exchanges,
       (SELECT count(*) FROM episodes e WHERE e.run = ex.run),
       (SELECT count(*) FROM turns t WHERE t.run = ex.run),
       ex.first_seen, ex.last_seen, $version
FROM ex LEFT JOIN fp_run ON fp_run.run = ex.run LEFT JOIN fp_up ON fp_up.upstream = ex.upstream
"""
# What run_tallies counts of each exchange of $runs: (field, value) pairs, NULLs left out; $only_new
# restricts them to the attempts without a turn yet (see _count_new).
_TALLIED_SQL = """
SELECT run, field, value, count(*) AS n
FROM (SELECT run, unnest(['model', 'condition', 'marker', 'marker_version', 'upstream', 'kind', 'sample_rate']) AS
    field,
             unnest([CASE WHEN is_attempt THEN model END, CASE WHEN is_attempt THEN condition END,
                     stack_marker, stack_marker_version, upstream, kind,
                     json_extract(record, '$.extra.sample.rate')::VARCHAR]) AS value
      FROM exchanges WHERE run IN (SELECT unnest($runs::VARCHAR[])) AND (NOT $only_new OR (is_attempt AND turn_id
          IS NULL)))
WHERE value IS NOT NULL GROUP BY ALL
"""
# The new count and times of each of $runs whose row counts all its exchanges but its attempts without a
# turn (checked by count; then those are what is new), and that has tallies (a run derived before
# storage step 11 has none).
_NEW_TOTALS_SQL = """
CREATE OR REPLACE TEMP TABLE _run_totals AS
WITH new AS (SELECT run, count(*) AS n, min(started_at) AS first_seen, max(coalesce(ended_at, started_at)) AS last_seen
             FROM exchanges WHERE is_attempt AND turn_id IS NULL AND run IN (SELECT unnest($runs::VARCHAR[])) GROUP
                 BY run),
     stored AS (SELECT run, count(*) AS n FROM exchanges WHERE run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run)
SELECT r.run, r.n_exchanges + coalesce(new.n, 0) AS n_exchanges, least(r.first_seen, new.first_seen) AS first_seen,
       greatest(r.last_seen, new.last_seen) AS last_seen
FROM runs r JOIN stored USING (run) LEFT JOIN new USING (run)
WHERE r.run IN (SELECT unnest($runs::VARCHAR[])) AND stored.n = r.n_exchanges + coalesce(new.n, 0)
  AND r.run IN (SELECT run FROM run_tallies)
"""


def derive(
    con, runs: Iterable[str], rules: Sequence[ExpectationRule] | None = None, progress=None, in_steps: bool = False
) -> dict[str, int]:
    """Rebuild turns, episodes and runs rows for these runs from their exchanges (idempotent).

    `rules`: expectation rules (analysis.classify.expectations); None uses the ones stored with the analysis.
    `progress` (toolproxy.term.progress.Progress): told the number of runs, advanced per run.
    `in_steps`: a derive of several batches commits the caller's open transaction after each and
    begins another (see _derive); the caller then holds a transaction again when this returns.

    Python does only what is sequential (grouping attempts into turns and episodes, loops,
    expectations); statements run per batch of runs, not per run, and what a turn copies from its
    final attempt is joined in SQL.
    """
    with gc_paused():
        return _derive(con, runs, rules, progress, in_steps)


def _derive(
    con, runs: Iterable[str], rules: Sequence[ExpectationRule] | None, progress, in_steps: bool = False
) -> dict[str, int]:
    """derive(). In steps, the runs are first marked unfinished and their rows deleted, then each
    batch's attempts are pointed at their turns, each followed by a commit: DuckDB holds a
    transaction's updates in memory it cannot spill (about 250 bytes an attempt: 1,000,000 of them
    did not fit --memory-limit 256MB in one transaction), and a commit lets them go. A crash
    between steps leaves the runs marked (state.unfinished_runs) and without a row, so reports do
    not show them half derived and the next derive_changes derives them whole. Each batch's turns
    are inserted with its step too: joining a whole run's staged turns with their final attempts at
    the end, sorted, did not fit 256MB at 1,000,000 turns either. That join then reads the final
    attempts' columns of the run once per batch (about 0.1 s of CPU per 50,000 turns at 1,000,000
    exchanges), not once in all."""
    if rules is None:
        rules = stored_rules(con)
    runs = sorted(set(runs))
    totals = {"turns": 0, "episodes": 0}
    if not runs:
        return totals
    _temp_tables(con)
    sizes = _run_sizes(con, runs)
    clocks = [run for run in runs if sizes.get(run, _NO_SIZE)[1] > 1]
    if progress is not None:
        progress.total = len(runs)
    split: set[str] = set()  # runs derived over several batches
    batches = _batches(con, runs, sizes)
    stepwise = in_steps and len(batches) > 1
    if stepwise:
        set_unfinished_runs(con, set(unfinished_runs(con)) | set(runs))
        con.execute("DELETE FROM runs WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs])
    con.execute("DELETE FROM turns WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs])
    con.execute("DELETE FROM episodes WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs])
    con.execute("DELETE FROM episode_keys WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs])
    if stepwise:
        _commit_step(con)
    if len(batches) > 1:
        con.execute("CREATE OR REPLACE TEMP TABLE _part_batch (prun VARCHAR, ppart VARCHAR, batch INTEGER)")
        rows = [(run, "", b) for b, (whole, _, _) in enumerate(batches) for run in whole]
        rows += [(run, part, b) for b, (_, parts, _) in enumerate(batches) for run, part in parts]
        insert_columns(
            con,
            "_part_batch",
            dict(zip(("prun", "ppart", "batch"), map(list, zip(*rows)))),
            {"prun": "VARCHAR", "ppart": "VARCHAR", "batch": "INTEGER"},
        )
        con.execute(_BATCHED_SQL, {"whole": [run for whole, _, _ in batches for run in whole], "clocks": clocks})
    for b, (whole, parts, done) in enumerate(batches):
        split.update(run for run, _ in parts if run not in done)
        in_batch = sorted(set(whole) | {run for run, _ in parts})
        if len(batches) > 1:
            result = con.execute(_BATCH_SQL, {"batch": b})
        else:
            result = con.execute(_ATTEMPTS_SQL, {"runs": in_batch, "clocks": clocks})
        cols = _columns(result.fetchnumpy())
        for chunk in _derived_chunks(cols, in_batch, clocks, rules):
            _stage(con, chunk, totals)
        if stepwise:
            _write_staged(con)
            _commit_step(con)
        if progress is not None:
            progress.advance(len(done))
    if len(batches) > 1:
        con.execute("DROP TABLE _batched")
        con.execute("DROP TABLE _part_batch")
    if split:
        _rejudge_loops(con, sorted(split))  # each batch judged its episodes' lengths by its own median
    _finish(con, runs)
    if (left := unfinished_runs(con)) and set(left) & set(runs):
        set_unfinished_runs(con, set(left) - set(runs))
    return totals


def _commit_step(con) -> None:
    con.execute("COMMIT")
    con.execute("BEGIN TRANSACTION")


_NO_SIZE = (0, 0, 0)


def _batches(con, runs: list[str], sizes: dict[str, tuple[int, int, int]]) -> list[tuple[list[str], list, set[str]]]:
    """The runs' attempts in batches of about _BATCH_ATTEMPTS: (whole runs, (run, part) pairs, the
    runs whose last attempts the batch holds). A run one clock recorded whose every untagged
    attempt has a thread (or no keys at all) is split into parts (_PART_SQL) when it is larger than
    a batch, so grouping it holds a batch of its attempts at a time, not all of them; the rest go
    whole. Parts group into the same episodes apart as together: none names another's keys."""
    large = [r for r in runs if sizes.get(r, _NO_SIZE)[0] > _BATCH_ATTEMPTS and sizes[r][1] <= 1 and not sizes[r][2]]
    parts_of: dict[str, list[tuple[str, int]]] = {}
    if large:
        for run, part, n in con.execute(_PARTS_SQL, {"runs": large}).fetchall():
            parts_of.setdefault(run, []).append((part, n))
    out = []
    whole: list[str] = []
    parts: list[tuple[str, str]] = []
    done: set[str] = set()
    size = 0
    for k, run in enumerate(runs):
        if run in parts_of:
            for part, n in parts_of[run]:
                if size and size + n > _BATCH_ATTEMPTS:
                    out.append((whole, parts, done))
                    whole, parts, done, size = [], [], set(), 0
                parts.append((run, part))
                size += n
        else:
            whole.append(run)
            size += sizes.get(run, _NO_SIZE)[0]
        done.add(run)
        if size >= _BATCH_ATTEMPTS or k + 1 == len(runs):
            out.append((whole, parts, done))
            whole, parts, done, size = [], [], set(), 0
    return out


def derive_changes(con, runs: Iterable[str], progress=None, whole: Iterable[str] = (), in_steps: bool = False) -> dict:
    """Bring turns, episodes and runs rows up to date after an ingest added records to `runs`.
    Returns the runs derived (these and any with attempts left underived), the turns and episodes
    they hold, the runs derived in part (`in_part`) and how many of their episodes were derived
    again (`episodes_in_part`).

    What is new is what no derivation has seen: attempts without a turn, which also finds those
    an analyze interrupted between storing and deriving left behind. A tagged episode of a run one
    clock recorded depends on its own attempts alone (its turns are its attempts in clock order,
    grouped by retries) and, for its loop flag, on the run's median episode length; so there only
    the episodes with new attempts are derived again, at a cost that follows the new data rather
    than the run. Untagged attempts of such a run are chained in clock order, each by what came
    before it: new ones that all come after the run's derived untagged attempts leave those where
    they are and can only join the episodes their keys name (_CHAINABLE_SQL, _derive_conversations).
    A run whose new untagged attempts are older than some derived one (they could take a
    continuation a derived attempt had, moving it to another episode), one several clocks recorded
    and a run not derived before are derived whole. Several clocks: attempts are chained in causal
    order, and a new attempt from a replica whose clock is behind can be the reply a derived attempt
    continues, or a failed try before a derived answer, which moves that attempt and what chained
    after it; and where derived attempts stood in causal order is not kept, so the episodes a new
    attempt can join could not be chained again without ordering the whole run anyway. `whole`: runs
    to derive whole in any case. Runs a derive in steps left unfinished are derived too, whole: their
    rows went in its first step. `in_steps`: as for derive(), for the runs derived whole."""
    pending = con.execute(
        "SELECT run, episode, min(started_at), count(*) = count(started_at) FROM exchanges "
        "WHERE is_attempt AND turn_id IS NULL GROUP BY run, episode"
    ).fetchall()
    runs = sorted(set(runs) | {run for run, *_ in pending} | set(unfinished_runs(con)))
    if not runs:
        return {"runs": [], "turns": 0, "episodes": 0, "in_part": [], "episodes_in_part": 0}
    new_episodes: dict[str, set[str]] = {}
    for run, episode, *_ in pending:
        if episode is not None:
            new_episodes.setdefault(run, set()).add(episode)
    # per run with new untagged attempts: the earliest of them, or None if one has no start time
    untagged = {run: since if timed else None for run, episode, since, timed in pending if episode is None}
    derived = {
        r[0] for r in con.execute("SELECT run FROM runs WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs]).fetchall()
    }
    clocked = _several_clocks(con, runs)
    one_clock = [r for r in runs if r in derived and r not in clocked]
    forced = set(whole)
    chainable = {r for r in one_clock if r in untagged and r not in forced and _chainable(con, r, untagged[r])}
    partial = [r for r in one_clock if (r not in untagged or r in chainable) and r not in forced]
    whole = [r for r in runs if r not in partial]
    with gc_paused():
        _derive(con, whole, None, progress, in_steps)
        _count_new(con, partial)
        in_part = _derive_in_part(con, {r: new_episodes.get(r, set()) for r in partial}, sorted(chainable))
    # every one of the runs' rows was just made (_finish), counting them: their turns are not counted again
    turns, episodes = con.execute(
        "SELECT coalesce(sum(n_turns), 0), coalesce(sum(n_episodes), 0) FROM runs "
        "WHERE run IN (SELECT unnest(?::VARCHAR[]))",
        [runs],
    ).fetchone()
    return {"runs": runs, "turns": turns, "episodes": episodes, "in_part": partial, "episodes_in_part": in_part}


def _count_new(con, runs: list[str]) -> None:
    """Add the runs' new attempts (without a turn yet) to their tallies and their stored rows' counts
    and times (_run_totals), where those are all that is new (_NEW_TOTALS_SQL): their rows are then
    made without aggregating the whole runs again (_finish, _RUNS_SQL). Before they are derived,
    while the new attempts are the ones without a turn; DuckDB skips the row groups where every
    attempt has one."""
    if not runs:
        return
    con.execute(_NEW_TOTALS_SQL, {"runs": runs})
    counted = {"runs": [r for (r,) in con.execute("SELECT run FROM _run_totals").fetchall()], "only_new": True}
    con.execute(f"CREATE OR REPLACE TEMP TABLE _new_tallies AS {_TALLIED_SQL}", counted)
    con.execute(
        "UPDATE run_tallies AS t SET n = t.n + d.n FROM _new_tallies d "
        "WHERE t.run = d.run AND t.field = d.field AND t.value = d.value"
    )
    con.execute(
        "INSERT INTO run_tallies SELECT * FROM _new_tallies d WHERE NOT EXISTS "
        "(SELECT 1 FROM run_tallies t WHERE t.run = d.run AND t.field = d.field AND t.value = d.value)"
    )
    con.execute("DROP TABLE _new_tallies")


# Whether a run's new untagged attempts, the earliest starting at $since, all come after every derived
# one in clock order (a tie in started_at, or a derived attempt without one, is left to the whole
# derive), with its episodes' keys in episode_keys (a run derived before it existed has none).
# Bounded by $since, the scan skips the row groups of the older attempts: it follows the new data.
_CHAINABLE_SQL = """
SELECT NOT EXISTS (SELECT 1 FROM exchanges WHERE is_attempt AND episode IS NULL AND run = $run AND turn_id IS NOT NULL
                   AND (started_at >= $since OR started_at IS NULL))
   AND (NOT EXISTS (SELECT 1 FROM exchanges WHERE is_attempt AND episode IS NULL AND run = $run AND turn_id IS NOT NULL)
        OR EXISTS (SELECT 1 FROM episode_keys WHERE run = $run))
"""


def _chainable(con, run: str, since) -> bool:
    """Whether _derive_conversations may chain this run's new untagged attempts (`since`: the
    earliest one's start, None if one has none)."""
    return since is not None and con.execute(_CHAINABLE_SQL, {"run": run, "since": since}).fetchone()[0]


# The episodes of a run whose turns were given one of these keys.
_NAMED_SQL = (
    "SELECT DISTINCT episode_key FROM episode_keys "
    "WHERE run = $run AND key IN (SELECT unnest($keys::VARCHAR[])) ORDER BY episode_key"
)
# The turns of these episodes of a run. Every bound here ($first and $last: the least and greatest of
# the episode keys, $lo and $hi: of their turn ids) leaves the rows as they are and lets DuckDB skip
# the row groups outside it: keys and turn ids are attempt ids, minted in time order
# (record.model.new_id), so the episodes new attempts join lie in the run's last row groups.
_TURNS_OF_SQL = (
    "SELECT turn_id FROM turns WHERE run = $run AND episode_key BETWEEN $first AND $last "
    "AND episode_key IN (SELECT unnest($episodes::VARCHAR[]))"
)
# A run's new untagged attempts and every attempt of these turns, in clock order; none starts before
# $since (the earliest of them).
_CONVERSATION_ATTEMPTS_SQL = (
    _ATTEMPT_COLUMNS_SQL + "WHERE is_attempt AND run = $run AND episode IS NULL AND started_at >= $since "
    "AND (turn_id IS NULL OR turn_id IN (SELECT unnest($turns::VARCHAR[]))) ORDER BY run, started_at, id"
)
# Where each attempt of these turns is: its episode's name and its turn (build_episodes' `placed`),
# and when it started.
_PLACED_SQL = (
    "SELECT x.id, e.episode, x.turn_id, x.started_at FROM exchanges x JOIN turns t ON t.turn_id = x.turn_id "
    "JOIN episodes e ON e.episode_key = t.episode_key "
    "WHERE x.is_attempt AND x.turn_id BETWEEN $lo AND $hi AND t.turn_id BETWEEN $lo AND $hi "
    "AND x.turn_id IN (SELECT unnest($turns::VARCHAR[]))"
)


def _derive_in_part(con, episodes: dict[str, set[str]], conversations: list[str]) -> int:
    """Derive again only these tagged episodes (run -> episode tags) and the conversations the new
    untagged attempts of `conversations` join, of runs one clock recorded, then the runs' loop
    flags and rows; derive_changes says when that equals deriving the runs. Returns how many
    episodes were derived."""
    runs = sorted(set(episodes) | set(conversations))
    if not runs:
        return 0
    rules = stored_rules(con)
    _temp_tables(con)
    totals = {"turns": 0, "episodes": 0}
    for run, names in sorted(episodes.items()):
        names = sorted(names)
        if not names:
            continue
        keys = [f"{run}/{name}" for name in names]
        con.execute("DELETE FROM turns WHERE run = ? AND episode_key IN (SELECT unnest(?::VARCHAR[]))", [run, keys])
        con.execute("DELETE FROM episodes WHERE run = ? AND episode_key IN (SELECT unnest(?::VARCHAR[]))", [run, keys])
        cols = _columns(con.execute(_EPISODE_ATTEMPTS_SQL, {"run": run, "episodes": names, "clocks": []}).fetchnumpy())
        for chunk in _derived_chunks(cols, [run], [], rules):
            _stage(con, chunk, totals)
    for run in conversations:
        _derive_conversations(con, run, rules, totals)
    _rejudge_loops(con, runs)
    _finish(con, runs)
    return totals["episodes"]


def _derive_conversations(con, run: str, rules: Sequence[ExpectationRule], totals: dict[str, int]) -> None:
    """Chain a run's new untagged attempts (all later than its derived ones) into its conversations
    and derive the episodes they join or start.

    A new attempt continues a turn its parent keys name, or retries a failed one of its own request
    (whose keys include request_key of that state): chaining looks at no other turn, so only the
    episodes those keys name in episode_keys take part, their attempts placed where they were
    derived, and the result is what chaining the whole run gives."""
    new = con.execute(
        "SELECT parent_hashes, state_hash, prior_hash, prefix_links, started_at FROM exchanges "
        "WHERE is_attempt AND run = ? AND episode IS NULL AND turn_id IS NULL",
        [run],
    ).fetchall()
    # A new request's links back are in the rows stored with it (keys.Prefixes), so among the new ones.
    links = link_map(row[3] for row in new)
    lookups: list[str] = []
    for parents, state, prior, *_ in new:
        lookups += parent_walk(parents or (), prior, links)
        if state:
            lookups.append(request_key(state))
    named = [k for (k,) in con.execute(_NAMED_SQL, {"run": run, "keys": lookups}).fetchall()]
    turns = [
        t
        for (t,) in con.execute(
            _TURNS_OF_SQL,
            {"run": run, "episodes": named, "first": min(named, default=None), "last": max(named, default=None)},
        ).fetchall()
    ]
    placed_rows = con.execute(
        _PLACED_SQL, {"turns": turns, "lo": min(turns, default=None), "hi": max(turns, default=None)}
    ).fetchall()
    placed = {x: (name, turn) for x, name, turn, _ in placed_rows}
    # every one has a start: the run is chainable (_CHAINABLE_SQL)
    since = min(row[-1] for rows in (new, placed_rows) for row in rows)
    cols = _columns(
        con.execute(_CONVERSATION_ATTEMPTS_SQL, {"run": run, "turns": turns, "clocks": [], "since": since}).fetchnumpy()
    )
    chunks = list(_derived_chunks(cols, [run], [], rules, placed))
    # with the episodes their attempts start (an interrupted analyze may have left rows of those behind)
    keys = sorted(set(named).union(*(chunk[1]["episode_key"] for chunk in chunks)))
    for table in ("turns", "episodes", "episode_keys"):
        con.execute(
            f"DELETE FROM {table} WHERE run = ? AND episode_key BETWEEN ? AND ? "
            "AND episode_key IN (SELECT unnest(?::VARCHAR[]))",
            [run, keys[0], keys[-1], keys],
        )
    for chunk in chunks:
        _stage(con, chunk, totals)


def _temp_tables(con) -> None:
    """Empty staging tables (a derive that failed after a step was committed leaves its staged rows)."""
    con.execute("CREATE TEMP TABLE IF NOT EXISTS _turn_map (id VARCHAR, turn_id VARCHAR)")
    con.execute(f"CREATE TEMP TABLE IF NOT EXISTS _turn_rows ({', '.join(f'{n} {TURNS.types[n]}' for n in _TURN_ROW)})")
    con.execute("DELETE FROM _turn_map")
    con.execute("DELETE FROM _turn_rows")


def _run_sizes(con, runs: list[str]) -> dict[str, tuple[int, int, int]]:
    """Per run: its attempts, how many replicas (so clocks) recorded them, and how many of its
    untagged attempts have keys but no thread."""
    return {
        run: (n, replicas, loose)
        for run, n, replicas, loose in con.execute(
            _RUN_SIZES_SQL, {"pattern": SEGMENT_REPLICA, "runs": runs}
        ).fetchall()
    }


def _several_clocks(con, runs: list[str]) -> set[str]:
    """The runs several replicas recorded. Every stored exchange's segment is in ingest_state (one
    transaction stores both, prune deletes both), so when its segments name one replica no run has
    more, and the runs' attempts need not be scanned: the usual store of one proxy."""
    replicas = con.execute(
        "SELECT count(DISTINCT regexp_extract(segment, ?, 1)) FROM ingest_state", [SEGMENT_REPLICA]
    ).fetchone()[0]
    if replicas <= 1:
        return set()
    return {run for run, (_, n, _) in _run_sizes(con, runs).items() if n > 1}


def _stage(con, derived: tuple, totals: dict[str, int]) -> None:
    """Insert derived episodes and their conversation keys, and stage turn rows and the attempt ->
    turn map for _finish."""
    turn_rows, episode_cols, key_cols, map_ex, map_turn = derived
    totals["turns"] += insert_columns(
        con, "_turn_rows", dict(zip(_TURN_ROW, turn_rows)), {n: TURNS.types[n] for n in _TURN_ROW}
    )
    totals["episodes"] += EPISODES.insert(con, episode_cols)
    EPISODE_KEYS.insert(con, key_cols)
    insert_columns(con, "_turn_map", {"id": map_ex, "turn_id": map_turn}, {"id": "VARCHAR", "turn_id": "VARCHAR"})


def _finish(con, runs: list[str]) -> None:
    """The staged turns joined with their final attempts, every attempt pointed at its turn, and the runs' rows
    (their tallies counted again over the run, but for the runs _count_new counted).

    The staged attempts' ids bound the scans of exchanges and calls (the same rows whatever the
    ids): the proxy mints them in time order (record.model.new_id), so when a few episodes were
    derived DuckDB skips the row groups of the rest of the run."""
    _write_staged(con)
    link_episodes(con, runs)
    con.execute(
        "CREATE TEMP TABLE IF NOT EXISTS _run_totals (run VARCHAR, n_exchanges BIGINT, first_seen TIMESTAMP, "
        "last_seen TIMESTAMP)"
    )
    # the runs _count_new did not count are tallied and totalled over all their exchanges
    aggregated = [
        r
        for (r,) in con.execute(
            "SELECT unnest($runs::VARCHAR[]) EXCEPT SELECT run FROM _run_totals", {"runs": runs}
        ).fetchall()
    ]
    con.execute("DELETE FROM run_tallies WHERE run IN (SELECT unnest(?::VARCHAR[]))", [aggregated])
    con.execute(f"INSERT INTO run_tallies {_TALLIED_SQL}", {"runs": aggregated, "only_new": False})
    con.execute("DELETE FROM runs WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs])
    con.execute(_RUNS_SQL, {"runs": runs, "whole": aggregated, "version": ANALYZER_VERSION})
    con.execute("DELETE FROM _run_totals")


def _write_staged(con) -> None:
    """The staged turns joined with their final attempts, and every staged attempt pointed at its
    turn; the staged ids bound the scans (see _finish)."""
    lo, hi = con.execute("SELECT min(id), max(id) FROM _turn_map").fetchone()
    if lo is None:
        return
    con.execute(_TURNS_SQL, {"version": ANALYZER_VERSION, "lo": lo, "hi": hi})
    con.execute(
        "UPDATE exchanges SET turn_id = m.turn_id, analyzer_version = $v FROM _turn_map m WHERE exchanges.id = m.id "
        "AND exchanges.id BETWEEN $lo AND $hi",
        {"v": ANALYZER_VERSION, "lo": lo, "hi": hi},
    )
    con.execute(
        "UPDATE calls SET turn_id = m.turn_id, analyzer_version = $v FROM _turn_map m WHERE calls.exchange_id = m.id "
        "AND calls.exchange_id BETWEEN $lo AND $hi",
        {"v": ANALYZER_VERSION, "lo": lo, "hi": hi},
    )
    con.execute("DELETE FROM _turn_map")
    con.execute("DELETE FROM _turn_rows")


def _rejudge_loops(con, runs: list[str]) -> None:
    """Loop flags of the runs' episodes under the runs' median episode length as it is now (an
    episode derived on its own was judged against its batch's median)."""
    by_run: dict[str, list[tuple]] = {}
    for run, key, n, reason in con.execute(
        "SELECT run, episode_key, n_turns, loop_reason FROM episodes WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs]
    ).fetchall():
        by_run.setdefault(run, []).append((key, n, reason))
    changed: dict[str, list] = {"episode_key": [], "loop_reason": []}
    for rows in by_run.values():
        median = statistics.median(n for _, n, _ in rows)
        for key, n, reason in rows:
            if (now := rejudged(reason, n, median)) != reason:
                changed["episode_key"].append(key)
                changed["loop_reason"].append(now)
    if changed["episode_key"]:
        con.execute("CREATE OR REPLACE TEMP TABLE _loops (episode_key VARCHAR, loop_reason VARCHAR)")
        insert_columns(con, "_loops", changed, {"episode_key": "VARCHAR", "loop_reason": "VARCHAR"})
        con.execute(
            "UPDATE episodes SET loop_reason = l.loop_reason, looping = l.loop_reason IS NOT NULL "
            "FROM _loops l WHERE episodes.episode_key = l.episode_key"
        )
        con.execute("DROP TABLE _loops")


# Attempt columns whose values repeat along a run (its name, an episode's tags, an outcome...):
# one string object per distinct value instead of one per attempt (share_strings). A batch is held whole while
# its episodes are grouped, so this is most of what an attempt costs in memory.
_REPEATING = frozenset(("run", "episode", "item", "category", "condition", "outcome", "sub_kind", "tags"))
_ATTEMPT_COLUMNS = ["run", *(f.name for f in dataclasses.fields(Attempt))]


def _columns(arrays: dict) -> list[Sequence]:
    """_ATTEMPTS_SQL's result as lists, each array let go once converted, the key lists split."""
    out = []
    for k, (name, column) in enumerate(zip(_ATTEMPT_COLUMNS, list(arrays), strict=True)):
        values = arrays.pop(column).tolist()
        if name in _REPEATING:
            values = share_strings(values)
        elif k in _KEY_LISTS:
            values = [[] if v is None else v.split() for v in values]
        out.append(values)
    return out


def _derived_chunks(
    cols: list[Sequence],
    runs: list[str],
    clocks: list[str],
    rules: Sequence[ExpectationRule],
    placed: dict[str, tuple[str, str]] | None = None,
) -> Iterator[tuple]:
    """The rows derived from the attempts `cols` (_columns) of these runs, in chunks of about
    _CHUNK_TURNS turns (_stage inserts each): turn rows (columns of _TURN_ROW), episode columns,
    reconstructed episodes' conversation keys (episode_keys columns) and the attempt -> turn map.
    `placed`: build_episodes'.

    Rows are let go chunk by chunk and a run's episodes as their rows are made: holding every row
    of a run beside its attempts added about 1.4 KB per attempt to what deriving it took."""
    run_of = cols[0]
    attempts = list(map(Attempt, *cols[1:]))
    cols.clear()
    spans: dict[str, tuple[int, int]] = {}
    start = 0
    for end in range(1, len(run_of) + 1):
        if end == len(run_of) or run_of[end] != run_of[start]:
            spans[run_of[start]] = (start, end)
            start = end
    clocked = set(clocks)
    categories: dict[tuple, str | None] = {}  # category_of(item, tag), which repeats along an episode
    chunk = _DerivedRows()
    for run in runs:
        start, end = spans.get(run, (0, 0))
        episodes = build_episodes(run, attempts[start:end], one_clock=run not in clocked, placed=placed)
        attempts[start:end] = [None] * (end - start)
        episodes.reverse()
        while episodes:
            ep = episodes.pop()
            chunk.add(run, ep, rules, categories)
            if len(chunk.turn_rows) >= _CHUNK_TURNS:
                yield chunk.rows()
                chunk = _DerivedRows()
    if chunk.turn_rows or chunk.episode_rows:
        yield chunk.rows()


# Turns per chunk of derived rows (_derived_chunks).
_CHUNK_TURNS = 20_000


class _DerivedRows:
    """Derived rows of some episodes, gathered to be staged together."""

    def __init__(self) -> None:
        self.turn_rows: list[tuple] = []
        self.episode_rows: list[tuple] = []
        self.map_ex: list[str] = []
        self.map_turn: list[str] = []
        self.keys: dict[str, list] = {"run": [], "episode_key": [], "key": []}

    def add(self, run: str, ep: Episode, rules: Sequence[ExpectationRule], categories: dict[tuple, str | None]) -> None:
        tags, expect = episode_expectation(run, ep, rules)
        for i, (turn, facts) in enumerate(zip(ep.turns, turn_facts(ep.turns))):
            head = turn.attempts[0]
            tid = head.id
            item = head.item or ep.item_key
            key = (item, head.category)
            if key not in categories:
                categories[key] = category_of(*key)
            self.turn_rows.append(
                (
                    tid,
                    run,
                    ep.key,
                    i,
                    item,
                    categories[key] or ep.category,
                    len(turn.attempts),
                    turn.attempts[-1].id,
                    expect,
                    *facts,
                )
            )
            if len(turn.attempts) == 1:
                self.map_ex.append(tid)
                self.map_turn.append(tid)
            else:
                for a in turn.attempts:
                    self.map_ex.append(a.id)
                    self.map_turn.append(tid)
        self.episode_rows.append(
            (
                ep.key,
                run,
                ep.name,
                ep.reconstructed,
                ep.item_key,
                ep.category,
                len(ep.turns),
                ep.looping,
                ep.loop_reason,
                expect,
                orjson.dumps({k: v for k, v in tags.items() if v is not None}).decode(),
                ANALYZER_VERSION,
                # links and task: link_episodes, once the run is derived
                None,
                None,
                None,
                ep.key,
            )
        )
        keys = list(dict.fromkeys(ep.keys))
        self.keys["run"] += [run] * len(keys)
        self.keys["episode_key"] += [ep.key] * len(keys)
        self.keys["key"] += keys

    def rows(self) -> tuple:
        turn_cols = [list(c) for c in zip(*self.turn_rows)] or [[] for _ in _TURN_ROW]
        episode_cols = dict(
            zip(EPISODES.names, [list(c) for c in zip(*self.episode_rows)] or [[] for _ in EPISODES.names])
        )
        return turn_cols, episode_cols, self.keys, self.map_ex, self.map_turn
