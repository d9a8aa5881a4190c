"""CSV: one flat row per run with raw numbers, for spreadsheets and pandas."""

from __future__ import annotations

import csv
import dataclasses
import io

from toolproxy.analysis.measure.metrics import METRICS
from toolproxy.analysis.measure.summary import NON_RESPONSE_KINDS, OUTCOMES, Report, RunSummary, Sampling

_RATES = (*METRICS, "non_response_rate")
_SAMPLING = [f.name for f in dataclasses.fields(Sampling)]


def _flat(s: RunSummary, kinds: list[str], outcomes: list[str], analyzer_version: int | None) -> dict:
    return {
        "run": s.run,
        "analyzer_version": analyzer_version,
        "stack": s.stack,
        "stack_version": s.stack_version,
        "model": s.model,
        "condition": s.condition,
        "turns": s.turns,
        "episodes": s.episodes,
        "rejected": s.rejected,
        "lost_in_serving": s.lost_in_serving,
        **{f"{name}_{k}": v for name in _RATES for k, v in dataclasses.asdict(getattr(s, name)).items()},
        **{f"role_{k}": v for k, v in s.roles.items()},
        **{f"outcome_{k}": s.outcomes.get(k, 0) for k in outcomes},
        **{f"non_response_{k}": s.non_response_kinds.get(k, 0) for k in kinds},
        **{f"non_response_{k}_retries": s.non_response_retries.get(k, 0) for k in kinds},
        "calls": s.calls,
        "text_calls": s.text_calls,
        "surfaced_as_text": s.surfaced_as_text,
        "harness_saw_prose": s.harness_saw_prose,
        "valid_seen_as_prose": s.valid_seen_as_prose,
        "looping_episodes": s.looping_episodes,
        **{
            f"sampling_{k}": v
            for k, v in (dataclasses.asdict(s.sampling) if s.sampling else dict.fromkeys(_SAMPLING)).items()
        },
    }


def render(report: Report) -> str:
    seen_kinds = {k for s in report.runs for k in s.non_response_kinds}
    kinds = list(NON_RESPONSE_KINDS) + sorted(seen_kinds - set(NON_RESPONSE_KINDS))
    outcomes = list(dict.fromkeys([*OUTCOMES, *(k for s in report.runs for k in s.outcomes)]))
    rows = [_flat(s, kinds, outcomes, report.analyzer_version) for s in report.runs]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["run"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
