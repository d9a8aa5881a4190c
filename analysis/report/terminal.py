"""The terminal table: aligned, one row per run, readable in 100 columns."""

from __future__ import annotations

import textwrap

from toolproxy.analysis.measure.summary import Report
from toolproxy.analysis.report.cells import (
    DETAIL_FIRST_NUMERIC,
    DETAIL_HEADERS,
    SHORT_FIRST_NUMERIC,
    SHORT_HEADERS,
    detail_row,
    legend,
    provenance,
    report_notes,
    short_row,
)

# Name-like columns give up width (ending in "…") when the table is wider than the terminal, the
# widest first; numbers never do, because a clipped number is a wrong number, and neither do run
# names, which a reader types back (`compare A B`): `react_agent-native` and `react_agent-native~2`
# both clipped to `react_agent-nativ…` named neither.
_SHRINK = ("model", "stack", "cond", "category")
_MIN_WIDTH = 6


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _layout(headers: list[str], rows: list[list[str]], width: int) -> tuple[list[int], str]:
    """Column widths and the gap between columns: two spaces, one if that is what makes it fit."""
    natural = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    gap = "  " if sum(natural) + 2 * (len(natural) - 1) <= width else " "
    widths = list(natural)
    excess = sum(widths) + len(gap) * (len(widths) - 1) - width
    columns = [headers.index(n) for n in _SHRINK if n in headers]
    while excess > 0 and columns:
        widest = max(columns, key=lambda i: widths[i])
        if widths[widest] <= _MIN_WIDTH:
            break
        widths[widest] -= 1
        excess -= 1
    return widths, gap


def aligned(headers: list[str], rows: list[list[str]], first_numeric: int, width: int = 100) -> list[str]:
    """Header, rule and rows; columns from `first_numeric` on are numbers (right-aligned, never clipped)."""
    widths, gap = _layout(headers, rows, width)

    def line(cells: list[str]) -> str:
        out = [
            _clip(c, w).rjust(w) if i >= first_numeric else _clip(c, w).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return gap.join(out).rstrip()

    return [line(headers), gap.join("-" * w for w in widths)] + [line(r) for r in rows]


def render(report: Report, width: int = 100) -> str:
    lines = aligned(list(SHORT_HEADERS), [short_row(s) for s in report.runs], SHORT_FIRST_NUMERIC, width)
    lines += [""] + aligned(list(DETAIL_HEADERS), [detail_row(s) for s in report.runs], DETAIL_FIRST_NUMERIC, width)
    notes = report_notes(report)
    if notes:
        lines.append("")
        for run, note in notes:
            lines += textwrap.wrap(f"{run}: {note}", width, subsequent_indent="    ")
    lines += [""] + textwrap.wrap(legend(), width) + textwrap.wrap(provenance(report), width)
    return "\n".join(lines) + "\n"
