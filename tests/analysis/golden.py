"""What an analysis concluded, without anything that differs between two runs of the same data.

Record ids are random and turn ids and reconstructed episode keys are made from them, so they are
left out; everything a report is made of stays: every classification column of every exchange,
calls, turns with their roles, episodes, runs and each run's metrics. Two analyses of one data dir
by two versions of the ingest must give equal summaries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import duckdb

from toolproxy.analysis.classify.keys import link_map, parent_walk
from toolproxy.analysis.measure.metrics import run_metrics, score

_GROUPED = {
    "exchanges": "run, kind, condition, is_attempt, streamed, model, status, client_status, error_kind, outcome, "
    "sub_kind, "
    "surface, n_calls, finish_reason, harness_saw_prose, stack_marker, stack_marker_version, n_messages, "
    "tool_results, tool_set IS NOT NULL, call_signature IS NOT NULL, _walked.n, "
    "md5(coalesce(content, '')), md5(coalesce(upstream_content, '')), prompt_tokens, completion_tokens, "
    "cached_tokens, record::VARCHAR, protocol, rejects, finishes, length(reply_keys), finisher",
    "calls": "name, arguments_raw, arguments::VARCHAR, surface, format, offered, validated, valid, "
    "schema_errors::VARCHAR",
    "turns": "run, turn_index, item_key, category, condition, model, outcome, sub_kind, surface, n_attempts, n_calls, "
    "finish_reason, harness_saw_prose, expect, delivered, offered_tools, tool_results, saw_result, is_last, role, "
    "md5(coalesce(content, '')), protocol, rejected, finishes, last_with_tools, finisher",
    "episodes": "run, reconstructed, item_key, category, n_turns, looping, loop_reason, expect",
    "runs": "run, stack, stack_version, model, condition, n_exchanges, n_episodes, n_turns",
}
# Conversation keys are hashes of content only (no ids): their sharing pattern must not change.
_DISTINCT = ("state_hash", "chain_hash", "item_hash", "call_signature", "turn_id")


# Shown in full, so that a difference says where it is; the rest is compared by digest.
_READABLE = "SELECT run, outcome, sub_kind, surface, role, delivered, count(*) FROM turns GROUP BY ALL"


def _walk_lengths(con: duckdb.DuckDBPyConnection) -> None:
    """_walked: how many parent keys each exchange names, walked as build_episodes walks them
    (its parent_hashes, then back from prior_hash along its run's links), which is what
    length(parent_hashes) was before storage step 9 stopped storing the earlier ones."""
    rows = con.execute("SELECT id, run, parent_hashes, prior_hash, prefix_links FROM exchanges").fetchall()
    links: dict = {}
    for _, run, _, _, pairs in rows:
        links.setdefault(run, []).append(pairs)
    maps = {run: link_map(p) for run, p in links.items()}
    n = [
        None if parents is None else len(list(parent_walk(parents, prior, maps[run])))
        for _, run, parents, prior, _ in rows
    ]
    con.execute("CREATE OR REPLACE TEMP TABLE _walked (id VARCHAR, n INTEGER)")
    con.executemany("INSERT INTO _walked VALUES (?, ?)", [(r[0], k) for r, k in zip(rows, n)])


def summary(con: duckdb.DuckDBPyConnection) -> dict:
    out: dict = {}
    _walk_lengths(con)
    for table, columns in _GROUPED.items():
        source = "exchanges LEFT JOIN _walked USING (id)" if table == "exchanges" else table
        rows = con.execute(f"SELECT {columns}, count(*) AS n FROM {source} GROUP BY ALL").fetchall()
        text = json.dumps(sorted([[str(v) if v is not None else None for v in row] for row in rows], key=str))
        out[table] = {
            "groups": len(rows),
            "rows": sum(r[-1] for r in rows),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
    out["turns_by_outcome"] = sorted([[str(v) for v in row] for row in con.execute(_READABLE).fetchall()])
    out["distinct"] = {c: con.execute(f"SELECT count(DISTINCT {c}) FROM exchanges").fetchone()[0] for c in _DISTINCT}
    runs = [r[0] for r in con.execute("SELECT run FROM runs ORDER BY run").fetchall()]
    score(con, runs)
    metrics = {}
    for run, m in run_metrics(con, runs, resamples=50).items():
        metrics[run] = {}
        for name, value in dataclasses.asdict(m).items():
            if isinstance(value, dict) and "numerator" in value:
                # the bootstrap interval resamples episodes in key order, and some keys hold ids
                value = {
                    k: (round(v, 9) if isinstance(v, float) else v)
                    for k, v in value.items()
                    if k not in ("ci_low", "ci_high")
                }
            metrics[run][name] = value
    out["metrics"] = metrics
    return out
