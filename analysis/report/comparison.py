"""Rendering a paired comparison: both discordant counts always beside the p-value, never p alone."""

from __future__ import annotations

import dataclasses
import textwrap

import orjson

from toolproxy.analysis.measure.compare import METRIC_HELP, Comparison, Paired
from toolproxy.analysis.measure.runline import plural, share_of
from toolproxy.analysis.measure.summary import RunSummary
from toolproxy.analysis.report.markdown import table
from toolproxy.analysis.report.terminal import aligned

COLUMNS = ("category", "paired items", "both pass", "A only", "B only", "both fail", "McNemar p", "Holm p")
SIGNIFICANCE = 0.05


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


def headline(s: RunSummary) -> str:
    """A run's headline over its turns, in the words and form of the run's line and the report."""
    undefined = "rej" if s.rejected else "-"
    return (
        f"call fidelity {share_of(s.call_fidelity).text(undefined)}, delivered "
        f"{share_of(s.delivered_fidelity).text(undefined)}, over its turns due a call"
    )


def heading(c: Comparison) -> list[str]:
    if c.replay:
        return _replay_heading(c)
    sides = [
        f"{label} = {run}" + (f": {c.headlines[run]}" if c.headlines and run in c.headlines else "")
        for label, run in (("A", c.run_a), ("B", c.run_b))
    ]
    pooled = ""
    if c.episodes is not None and c.episodes != (c.overall.paired, c.overall.paired):
        pooled = (
            f", from A's {plural(c.episodes[0], 'episode')} and B's {c.episodes[1]}: an item's episodes are "
            "judged together, as one item"
        )
    return [
        *sides,
        f"Item by item, metric {c.metric}: {METRIC_HELP[c.metric]}.",
        f"paired items: {c.overall.paired} (only in A: {c.only_in_a}, only in B: {c.only_in_b}){pooled}; "
        "exact two-sided McNemar on the discordant items (A only vs B only)"
        + ("; Holm-adjusted across categories." if c.categories else "."),
    ]


def footing(c: Comparison) -> list[str]:
    """Under the table, what its numbers say: why items fail that the rates above do not show, and
    what the p-value means here."""
    out = []
    if c.unscored and any(c.unscored):
        out.append(
            f"Of the paired items, {c.unscored[0]} in A and {c.unscored[1]} in B had no turn this metric scores (no "
            "turn due a call: the episode ended in prose without a tool result; or, on an item expecting no call, "
            "no turn at all), so they fail: the rates above count turns, this table items."
        )
    o = c.overall
    if o.a_only + o.b_only == 0:
        out.append("No item passed under one and failed under the other: nothing tells A and B apart (p 1).")
    else:
        verdict = (
            f"below {SIGNIFICANCE:g}: a difference this lopsided is unlikely by chance"
            if o.p < SIGNIFICANCE
            else f"not below {SIGNIFICANCE:g}: these {o.paired} items cannot tell A and B apart"
        )
        out.append(
            f"McNemar p {p_text(o.p)}: how likely a split of the discordant items at least as lopsided as "
            f"{o.a_only} (A only) to {o.b_only} (B only) would be if A and B did equally well on these items; "
            f"{verdict}."
        )
    return out


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
    lines += [""] + aligned(columns(c), rows(c), 1, width)
    if not c.replay:
        lines += [""] + [line for para in footing(c) for line in textwrap.wrap(para, width)]
    return "\n".join(lines) + "\n"


def render_markdown(c: Comparison) -> str:
    lines = [f"## {c.run_a} vs {c.run_b}", ""] + [f"{x}  " for x in heading(c)] + [""]
    lines += table(columns(c), rows(c), 1)
    if not c.replay:
        lines += [""] + footing(c)
    return "\n".join(lines) + "\n"


def render_json(c: Comparison) -> str:
    doc = dataclasses.asdict(c) | {"metric_rule": METRIC_HELP[c.metric]}
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


RENDERERS = {"table": render_table, "markdown": render_markdown, "json": render_json}
