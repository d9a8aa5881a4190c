"""Rendering a paired comparison: both discordant counts always beside the p-value, never p alone."""

from __future__ import annotations

import dataclasses
import textwrap

import orjson

from toolproxy.analysis.measure.compare import METRIC_HELP, Comparison, Paired
from toolproxy.analysis.report.markdown import table
from toolproxy.analysis.report.terminal import aligned

COLUMNS = ("category", "paired", "both pass", "A only", "B only", "both fail", "McNemar p", "Holm p")


def p_text(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.1e}" if p < 1e-3 else f"{p:.4f}"


def _cells(row: Paired) -> list[str]:
    return [
        row.label,
        *(str(x) for x in (row.paired, row.both_pass, row.a_only, row.b_only, row.both_fail)),
        p_text(row.p),
        p_text(row.p_holm),
    ]


def columns(c: Comparison) -> list[str]:
    """The Holm column only when several categories were tested at once."""
    return list(COLUMNS if c.categories else COLUMNS[:-1])


def rows(c: Comparison) -> list[list[str]]:
    return [_cells(r)[: len(columns(c))] for r in [*c.categories, c.overall]]


REPLAY_NOTE = (
    "B replays A's turns open-loop (each turn sent with the history A's harness built, never "
    "with B's answers), so an item here is one turn of A, and B's turn is judged on the question A's "
    "turn was asked (due a call, or expected to abstain)."
)


def heading(c: Comparison) -> list[str]:
    if c.replay:
        return _replay_heading(c)
    return [
        f"A = {c.run_a}, B = {c.run_b}; metric {c.metric}: {METRIC_HELP[c.metric]}.",
        f"paired items: {c.overall.paired} (only in A: {c.only_in_a}, only in B: {c.only_in_b}); "
        "exact two-sided McNemar on the discordant pairs (A only vs B only)"
        + ("; Holm-adjusted across categories." if c.categories else "."),
    ]


def _replay_heading(c: Comparison) -> list[str]:
    left = "; ".join(f"{why} {n}" for why, n in (c.left_out or {}).items()) or "none"
    return [
        f"A = {c.run_a}, B = {c.run_b} (a replay of A); metric {c.metric}, per turn.",
        REPLAY_NOTE,
        f"paired turns: {c.overall.paired} (turns of A not replayed: {c.only_in_a}); left out of the test, "
        f"not counted as losses: {left}.",
        "exact two-sided McNemar on the discordant turns (A only vs B only)"
        + ("; Holm-adjusted across categories." if c.categories else "."),
    ]


def render_table(c: Comparison, width: int = 100) -> str:
    lines = [line for para in heading(c) for line in textwrap.wrap(para, width)]
    return "\n".join(lines + [""] + aligned(columns(c), rows(c), 1, width)) + "\n"


def render_markdown(c: Comparison) -> str:
    lines = [f"## {c.run_a} vs {c.run_b}", ""] + [f"{x}  " for x in heading(c)] + [""]
    lines += table(columns(c), rows(c), 1)
    return "\n".join(lines) + "\n"


def render_json(c: Comparison) -> str:
    doc = dataclasses.asdict(c) | {"metric_rule": METRIC_HELP[c.metric]}
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


RENDERERS = {"table": render_table, "markdown": render_markdown, "json": render_json}
