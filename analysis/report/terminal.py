"""The terminal table: aligned, one row per run, readable in 100 columns."""

from __future__ import annotations

from analysis.report.cells import FIRST_NUMERIC, SHORT_HEADERS, provenance, report_notes, row
from analysis.summary import Report

# Name-like columns give up width (ending in "…") when the table is wider than the terminal, the
# widest first and the run name last; numbers never do, because a clipped number is a wrong number.
_SHRINK_FIRST = ("model", "stack", "condition", "category")
_SHRINK_LAST = ("run",)
_MIN_WIDTH = 6
_GAP = "  "


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _widths(headers: list[str], rows: list[list[str]], width: int) -> list[int]:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    excess = sum(widths) + len(_GAP) * (len(widths) - 1) - width
    for group in (_SHRINK_FIRST, _SHRINK_LAST):
        columns = [headers.index(n) for n in group if n in headers]
        while excess > 0 and columns:
            widest = max(columns, key=lambda i: widths[i])
            if widths[widest] <= _MIN_WIDTH:
                break
            widths[widest] -= 1
            excess -= 1
    return widths


def aligned(headers: list[str], rows: list[list[str]], first_numeric: int, width: int = 100) -> list[str]:
    """Header, rule and rows; columns from `first_numeric` on are numbers (right-aligned, never clipped)."""
    widths = _widths(headers, rows, width)

    def line(cells: list[str]) -> str:
        out = [_clip(c, w).rjust(w) if i >= first_numeric else _clip(c, w).ljust(w)
               for i, (c, w) in enumerate(zip(cells, widths))]
        return _GAP.join(out).rstrip()

    return [line(headers), _GAP.join("-" * w for w in widths)] + [line(r) for r in rows]


def render(report: Report, width: int = 100) -> str:
    lines = aligned(list(SHORT_HEADERS), [row(s, versions=False) for s in report.runs], FIRST_NUMERIC, width)
    notes = report_notes(report)
    if notes:
        lines.append("")
        lines.extend(f"{run}: {note}" for run, note in notes)
    lines += ["", "fidelity = valid_call turns / turns the model produced (per-episode mean [95% CI]; pooled over turns);",
              "rej = every turn was a non-response; text = share of calls found in the reply text, not in tool_calls.",
              provenance(report)]
    return "\n".join(lines) + "\n"
