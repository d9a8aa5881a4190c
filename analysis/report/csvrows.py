"""CSV: one flat row per run with raw numbers, for spreadsheets and pandas."""

from __future__ import annotations

import csv
import io

from analysis.summary import NON_RESPONSE_KINDS, OUTCOMES, Report, RunSummary

_FIDELITY = ("produced", "valid", "non_responses", "pooled", "non_response_rate", "episode_mean", "ci_low",
             "ci_high", "episodes_rated", "episodes_unrated")


def _flat(s: RunSummary, kinds: list[str], outcomes: list[str]) -> dict:
    f = s.fidelity
    return {
        "run": s.run, "stack": s.stack, "stack_version": s.stack_version, "model": s.model, "condition": s.condition,
        "turns": s.turns, "episodes": s.episodes, "rejected": s.rejected,
        **{f"fidelity_{k}" if k in ("pooled", "episode_mean") else k: getattr(f, k) for k in _FIDELITY},
        **{f"outcome_{k}": s.outcomes.get(k, 0) for k in outcomes},
        **{f"non_response_{k}": s.non_response_kinds.get(k, 0) for k in kinds},
        "calls": s.calls, "text_calls": s.text_calls, "surfaced_as_text": s.surfaced_as_text,
        "harness_saw_prose": s.harness_saw_prose, "valid_seen_as_prose": s.valid_seen_as_prose, "looping_episodes": s.looping_episodes,
    }


def render(report: Report) -> str:
    seen_kinds = {k for s in report.runs for k in s.non_response_kinds}
    kinds = list(NON_RESPONSE_KINDS) + sorted(seen_kinds - set(NON_RESPONSE_KINDS))
    outcomes = list(dict.fromkeys([*OUTCOMES, *(k for s in report.runs for k in s.outcomes)]))
    rows = [_flat(s, kinds, outcomes) for s in report.runs]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["run"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
