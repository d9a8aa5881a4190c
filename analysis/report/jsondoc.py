"""JSON: every number unformatted (fractions, not percents; null when undefined), for other tools."""

from __future__ import annotations

import dataclasses

import orjson

from analysis import stats
from analysis.summary import Report, RunSummary


def run_dict(s: RunSummary) -> dict:
    """A run's fields plus the derived shares and the `rejected` flag a consumer must not recompute."""
    return dataclasses.asdict(s) | {
        "rejected": s.rejected,
        "outcome_shares": s.outcome_shares,
        "surfaced_as_text": s.surfaced_as_text,
    }


def render(report: Report) -> str:
    doc = {
        "toolproxy_version": report.toolproxy_version,
        "generated_at": report.generated_at,
        "source": report.source,
        "bootstrap": {"resamples": report.resamples, "seed": report.seed, "confidence": stats.CONFIDENCE, "unit": "episode"},
        "runs": [run_dict(s) for s in report.runs],
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
