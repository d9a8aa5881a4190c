"""JSON: every number unformatted (fractions, not percents; null when undefined), for other tools."""

from __future__ import annotations

import dataclasses

import orjson

from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.analysis.measure import stats
from toolproxy.analysis.measure.summary import Report, RunSummary
from toolproxy.analysis.report.provenance import Provenance

# RunSummary properties each run carries beside its fields (docschema types them from their annotations).
DERIVED = ("rejected", "outcome_shares", "surfaced_as_text", "lost_in_serving")


def run_dict(s: RunSummary, origin: Provenance | None = None) -> dict:
    """A run's fields plus the derived shares and the `rejected` flag a consumer must not recompute,
    and what produced its numbers (null where no provenance was read)."""
    return (
        {"run": s.run}
        | dataclasses.asdict(s)
        | {name: getattr(s, name) for name in DERIVED}
        | {"provenance": origin.as_dict() if origin is not None else None}
    )


def render(report: Report, origins: dict[str, Provenance] | None = None) -> str:
    doc = {
        "toolproxy_version": report.toolproxy_version,
        "generated_at": report.generated_at,
        "source": report.source,
        "analyzer_version": report.analyzer_version,
        "analyzer_version_current": ANALYZER_VERSION,
        "expect_rules": report.expect_rules,
        "intervals": {"pooled": "wilson", "confidence": stats.CONFIDENCE},
        "bootstrap": {
            "resamples": report.resamples,
            "seed": report.seed,
            "confidence": stats.CONFIDENCE,
            "unit": "episode",
            "min_episodes": stats.MIN_EPISODES,
        },
        "runs": [run_dict(s, (origins or {}).get(s.run)) for s in report.runs],
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
