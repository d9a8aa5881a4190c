"""Markdown: the run table, the outcome composition and the notes, diffable when committed."""

from __future__ import annotations

import html
import re

from toolproxy.analysis.measure.summary import Report
from toolproxy.analysis.report.cells import (
    FIRST_NUMERIC,
    HEADERS,
    OUTCOME_LABELS,
    episode_cell,
    kinds_text,
    legend,
    pct,
    provenance,
    report_notes,
    roles_cell,
    row,
)

_NEWLINES = re.compile(r"\r\n|\r|\n")


def esc(text: str) -> str:
    """Text from a recording (run names, models, notes) as inert Markdown: HTML shown, not run, and
    no `|` or newline that would end a table cell or start a new block."""
    return _NEWLINES.sub("<br>", html.escape(text, quote=False).replace("|", "\\|"))


def table(headers: list[str], rows: list[list[str]], first_numeric: int) -> list[str]:
    align = ["---:" if i >= first_numeric else "---" for i in range(len(headers))]
    return ["| " + " | ".join(map(esc, headers)) + " |", "| " + " | ".join(align) + " |"] + [
        "| " + " | ".join(map(esc, r)) + " |" for r in rows
    ]


def render(report: Report) -> str:
    lines = ["# toolproxy report", "", provenance(report), "", "## Runs", ""]
    lines += table(list(HEADERS), [row(s, digits=1) for s in report.runs], FIRST_NUMERIC)
    lines += ["", legend(), "", "## Per episode, roles and non-responses", ""]
    lines += table(
        [
            "run",
            "call fidelity, per-episode mean",
            "delivered fidelity, per-episode mean",
            "turns by role",
            "non-responses by cause",
        ],
        [
            [
                s.run,
                episode_cell(s, s.call_fidelity, 1),
                episode_cell(s, s.delivered_fidelity, 1),
                roles_cell(s),
                kinds_text(s.non_response_kinds, s.non_response_retries) or "-",
            ]
            for s in report.runs
        ],
        1,
    )
    lines += ["", "## Outcome composition (share of all turns, non-responses included)", ""]
    outcome_keys = list(dict.fromkeys(k for s in report.runs for k in s.outcomes))
    lines += table(
        ["run"] + [OUTCOME_LABELS.get(k, k) for k in outcome_keys],
        [[s.run] + [f"{pct(s.outcome_shares[k], 1)} ({s.outcomes[k]})" for k in outcome_keys] for s in report.runs],
        1,
    )
    notes = report_notes(report)
    if notes:
        lines += ["", "## Notes", ""] + [f"- **{esc(run)}**: {esc(note)}" for run, note in notes]
    return "\n".join(lines) + "\n"
