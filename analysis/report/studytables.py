"""A study's two tables, as a paper puts them: models x conditions per stack, stacks x models per condition.

A study (`toolproxy study`) saves its plan as DATA/studies/NAME.json: its upstreams, models,
conditions and, per cell, the run it was recorded under. Each table cell is one (stack, model,
condition) of that plan, its repeats pooled, headed by the one number every view of a run
leads with (analysis.measure.runline): call fidelity pooled over the cell's turns, with its Wilson
95% interval and its count, delivered fidelity beside it in the same form, and only with enough
episodes (stats.MIN_EPISODES due a call) the per-episode mean, labelled as such. `rej` with the
cause in words when every turn was a non-response (a stack that refused is not a model that
failed); a cell with no finished run says why (not run yet, interrupted ...). Below them the
paired tests over the same items: each condition against the first within a stack and model,
each stack against the first within a model and condition; exact McNemar on the delivered
verdicts, Holm-corrected within each of those two families.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import duckdb
import numpy as np

from toolproxy.analysis.measure import stats
from toolproxy.analysis.measure.compare import compare
from toolproxy.analysis.measure.runline import cause_text, plural, share_of
from toolproxy.analysis.measure.summary import RunSummary, summarize
from toolproxy.analysis.report.htmlpage import provenance_section
from toolproxy.analysis.store.connection import StoreError

STUDY_DIR = "studies"
FINISHED = ("done", "failed")  # a cut-short run's turns are never mixed into a cell ("failed": older plans)
CONDITIONS, STACKS = "conditions within a stack and model", "stacks within a model and condition"
NO_DATA = "-"
# Why a cell has no finished run, by the plan's status of its runs (toolproxy.drive.study).
NOT_FINISHED = {
    "pending": "not run yet",
    "interrupted": "interrupted: run the study again to redo it",
    "unreached": "the upstream stopped answering: run the study again",
    "no_requests": "no request reached the proxy",
}
# The model axis when the study gave no --model: each cell asked for what the harness named.
HARNESS_MODEL = "the harness's model"


def plan_path(data_dir: Path, name: str) -> Path:
    return data_dir / STUDY_DIR / f"{name}.json"


def load_plan(data_dir: Path, name: str) -> dict:
    """The study's saved plan; a missing or unreadable one is a StoreError that says where it looked."""
    path = plan_path(data_dir, name)
    try:
        plan = json.loads(path.read_text())
        if not isinstance(plan.get("runs"), list) or not isinstance(plan.get("conditions"), list):
            raise ValueError("no runs or conditions")
    except FileNotFoundError:
        raise StoreError(
            f"no study named {name!r} in {path.parent} (toolproxy study --name {name} writes it)"
        ) from None
    except (OSError, ValueError, AttributeError) as exc:
        raise StoreError(f"{path} is not a study's plan: {exc}") from None
    return plan


@dataclass(frozen=True)
class StudyCell:
    stack: str | None
    model: str | None
    condition: str
    runs: tuple[str, ...]
    delivered: stats.Rate | None = None
    call: stats.Rate | None = None
    turns: int = 0
    non_responses: dict[str, int] = field(default_factory=dict)
    causes: dict[str, str] = field(default_factory=dict)
    unfinished: str | None = None  # why the cell has no finished run, in words

    @property
    def rejected(self) -> bool:
        """Every turn a non-response: no fidelity is defined, and none reads 0%."""
        return self.turns > 0 and sum(self.non_responses.values()) >= self.turns

    def cause(self) -> str:
        return "; ".join(
            cause_text(kind, n, self.causes.get(kind))
            for kind, n in sorted(self.non_responses.items(), key=lambda kv: -kv[1])
        )

    @property
    def scored(self) -> bool:
        """Some turn was due a call: the headline is defined."""
        return not self.rejected and self.call is not None and self.call.denominator > 0

    def headline(self) -> str:
        """Call fidelity as every view of a run writes it ("86% [49-97] (6/7)"), `rej`, or `-`."""
        if self.rejected:
            return "rej"
        return share_of(self.call).text() if self.scored else NO_DATA

    def delivered_text(self) -> str:
        return share_of(self.delivered).text() if self.scored else NO_DATA

    def episode_text(self) -> str | None:
        """The per-episode mean of call fidelity, labelled, when enough episodes were due a call."""
        r = self.call
        if r is None or r.episode_mean is None or r.episodes_rated < stats.MIN_EPISODES:
            return None
        mean = f"per-episode mean {100 * r.episode_mean:.0f}%"
        over = f"over {plural(r.episodes_rated, 'episode')}"
        if r.ci_low is None:
            return f"{mean} {over} (every one the same: no interval)"
        return f"{mean} [{100 * r.ci_low:.0f}-{100 * r.ci_high:.0f}] {over}"

    def text(self) -> str:
        """The whole cell in words: the headline, delivered beside it, then what else there is, each labelled."""
        if not self.runs or self.turns == 0:
            return self.unfinished or NO_DATA
        if self.rejected:
            return f"rej ({self.cause()})"
        if not self.scored:
            return f"{NO_DATA} (no turn was due a call, of {plural(self.turns, 'turn')})"
        out = f"call {self.headline()}; delivered {self.delivered_text()}"
        if (mean := self.episode_text()) is not None:
            out += f"; {mean}"
        n = sum(self.non_responses.values())
        if n:
            out += f"; {n} of {self.turns} turns non-responses ({self.cause()})"
        return out


@dataclass(frozen=True)
class PairedTest:
    """One paired McNemar between two cells over the items both ran (A the baseline)."""

    family: str
    within: str
    a: str
    b: str
    paired: int = 0
    a_only: int = 0
    b_only: int = 0
    p: float | None = None
    p_holm: float | None = None
    note: str | None = None


@dataclass
class StudyTables:
    name: str
    stacks: list[str | None]
    models: list[str | None]
    conditions: list[str]
    cells: dict[tuple, StudyCell]
    tests: list[PairedTest]
    upstreams: dict[str | None, str]
    summaries: dict[str, RunSummary]
    seed: int

    def cell(self, stack: str | None, model: str | None, condition: str) -> StudyCell:
        return self.cells.get((stack, model, condition)) or StudyCell(stack, model, condition, ())


_EPISODES_SQL = """
select run, episode_key,
       count(*) filter (where role = 'call' and delivered) as delivered_k,
       count(*) filter (where role = 'call' and outcome = 'valid_call') as call_k,
       count(*) filter (where role = 'call') as call_n,
       count(*) as turns,
       count(*) filter (where outcome = 'non_response') as non_responses
from scored group by run, episode_key order by run, episode_key
"""


def build(con: duckdb.DuckDBPyConnection, plan: dict, source: str, seed: int = 0) -> StudyTables:
    """The tables of a saved study from the analysed store."""
    upstreams = {name: url for name, url in plan.get("upstreams") or [[None, plan.get("upstream")]]}
    stacks = list(upstreams)
    models = list(plan.get("models") or []) or [None]
    conditions = list(plan["conditions"])
    finished = [r for r in plan["runs"] if r.get("status") in FINISHED]
    known = {r[0] for r in con.execute("select run from runs").fetchall()}
    runs = [r["run"] for r in finished if r["run"] in known]
    report = summarize(con, runs, source, seed=seed)
    summaries = {s.run: s for s in report.runs}
    episodes: dict[str, list[tuple]] = {}
    for row in con.execute(_EPISODES_SQL).fetchall():
        episodes.setdefault(row[0], []).append(row[2:])
    cells = {}
    for stack in stacks:
        for model in models:
            for condition in conditions:
                planned = [
                    r
                    for r in plan["runs"]
                    if r.get("stack") == stack and r.get("model") == model and r["condition"] == condition
                ]
                mine = tuple(r["run"] for r in planned if r.get("status") in FINISHED and r["run"] in summaries)
                cell = _cell(stack, model, condition, mine, episodes, summaries, seed)
                if not mine:
                    why = [NOT_FINISHED.get(r.get("status"), r.get("status")) for r in planned]
                    cell = StudyCell(**{**cell.__dict__, "unfinished": "; ".join(dict.fromkeys(why)) or None})
                cells[(stack, model, condition)] = cell
    tests = _tests(con, plan["runs"], summaries, stacks, models, conditions)
    return StudyTables(plan.get("name", ""), stacks, models, conditions, cells, tests, upstreams, summaries, seed)


def _cell(stack, model, condition, runs, episodes, summaries, seed) -> StudyCell:
    rows = [e for run in runs for e in episodes.get(run, [])]
    if not rows:
        return StudyCell(stack, model, condition, runs)
    delivered_k, call_k, call_n, turns, _ = (np.array(c, dtype=np.int64) for c in zip(*rows))
    kinds: dict[str, int] = {}
    causes: dict[str, str] = {}
    for run in runs:
        s = summaries[run]
        for kind, n in (s.non_response_kinds or {}).items():
            kinds[kind] = kinds.get(kind, 0) + int(n)
        causes.update(s.non_response_causes)
    return StudyCell(
        stack,
        model,
        condition,
        runs,
        stats.proportion(delivered_k, call_n, seed=seed),
        stats.proportion(call_k, call_n, seed=seed),
        int(turns.sum()),
        kinds,
        causes,
    )


def _tests(con, planned, summaries, stacks, models, conditions) -> list[PairedTest]:
    """Repeat k of one cell against repeat k of its baseline, per family, Holm within each."""
    by_cell = {
        (r.get("stack"), r.get("model"), r["condition"], r["repeat"]): r["run"]
        for r in planned
        if r.get("status") in FINISHED and r["run"] in summaries
    }
    unfinished = {
        (r.get("stack"), r.get("model"), r["condition"], r["repeat"]): NOT_FINISHED.get(r.get("status"), "no run")
        for r in planned
        if r.get("status") not in FINISHED
    }
    repeats = sorted({r["repeat"] for r in planned})
    pairs = []
    for k in repeats:
        for stack in stacks:
            for model in models:
                for condition in conditions[1:]:
                    pairs.append(
                        (
                            CONDITIONS,
                            _label(stack, model),
                            (stack, model, conditions[0], k),
                            (stack, model, condition, k),
                            conditions[0],
                            condition,
                        )
                    )
        for model in models:
            for condition in conditions:
                for stack in stacks[1:]:
                    pairs.append(
                        (
                            STACKS,
                            _label(None, model, condition),
                            (stacks[0], model, condition, k),
                            (stack, model, condition, k),
                            stacks[0],
                            stack,
                        )
                    )
    tests = []
    for family, within, key_a, key_b, label_a, label_b in pairs:
        run_a, run_b = by_cell.get(key_a), by_cell.get(key_b)
        suffix = f" (repeat {key_a[3]})" if len(repeats) > 1 else ""
        if run_a is None or run_b is None:
            why = "; ".join(
                f"{label}: {unfinished.get(key, 'no run')}"
                for key, label, run in ((key_a, label_a, run_a), (key_b, label_b, run_b))
                if run is None
            )
            tests.append(PairedTest(family, within + suffix, label_a, label_b, note=why))
            continue
        try:
            c = compare(con, run_a, run_b, metric="delivered")
        except StoreError:
            tests.append(PairedTest(family, within + suffix, label_a, label_b, note="no items in common"))
            continue
        o = c.overall
        tests.append(PairedTest(family, within + suffix, label_a, label_b, o.paired, o.a_only, o.b_only, o.p))
    out = []
    for family in (CONDITIONS, STACKS):
        mine = [t for t in tests if t.family == family]
        adjusted = iter(stats.holm([t.p for t in mine if t.p is not None]))
        out += [PairedTest(**{**t.__dict__, "p_holm": next(adjusted)}) if t.p is not None else t for t in mine]
    return out


def _label(stack: str | None, model: str | None, condition: str | None = None) -> str:
    return ", ".join(x for x in (stack, model, condition) if x) or "the study"


def _p(p: float | None) -> str:
    return NO_DATA if p is None else f"{p:.3g}"


# ---------------------------------------------------------------- markdown


def _md_table(head: str, rows: list[str | None], columns: list[str | None], cell) -> list[str]:
    names = [str(c) if c is not None else HARNESS_MODEL for c in columns]
    out = [f"| {head} | " + " | ".join(names) + " |", "|---|" + "---|" * len(columns)]
    for row in rows:
        out.append(
            f"| {HARNESS_MODEL if row is None else row} | " + " | ".join(cell(row, c).text() for c in columns) + " |"
        )
    return out


def _key(seed: int) -> list[str]:
    return [
        "Each cell, its repeats pooled: **call fidelity** (valid calls / turns due a call, pooled over the "
        "cell's turns: the rate, its Wilson 95% interval, and the count), the number the study's run table "
        "and `toolproxy report` lead with; then **delivered** fidelity in the same form (of those turns, the "
        "calls that reached the harness as calls); with at least "
        f"{stats.MIN_EPISODES} episodes due a call, the **per-episode mean** of call fidelity (each episode "
        f"weighted equally; bootstrap 95% interval, 10,000 resamples, seed {seed}). `rej`: every turn was a "
        "non-response, with its cause; no fidelity is defined there.",
    ]


def render_markdown(t: StudyTables, provenance: list | None = None) -> str:
    lines = [
        f"# Study {t.name}: tables",
        "",
        *_key(t.seed),
        "",
    ]
    for stack in t.stacks:
        title = f"stack {stack} ({t.upstreams[stack]})" if stack is not None else f"upstream {t.upstreams[stack]}"
        lines += [f"## Models x conditions, {title}", ""]
        lines += _md_table("model", t.models, t.conditions, lambda m, c, s=stack: t.cell(s, m, c)) + [""]
    if len(t.stacks) > 1 or t.stacks[0] is not None:
        for condition in t.conditions:
            lines += [f"## Stacks x models, condition {condition}", ""]
            lines += _md_table("stack", t.stacks, t.models, lambda s, m, c=condition: t.cell(s, m, c)) + [""]
    if t.tests:
        lines += [
            "## Paired tests over the same items",
            "",
            "Exact McNemar on the delivered verdict per item (A = the baseline: the first condition, or the "
            "first stack); Holm-corrected within each family.",
            "",
            "| family | within | A | B | paired items | A only | B only | p | p (Holm) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for x in t.tests:
            if x.note:
                lines.append(f"| {x.family} | {x.within} | {x.a} | {x.b} | {x.note} | - | - | - | - |")
            else:
                lines.append(
                    f"| {x.family} | {x.within} | {x.a} | {x.b} | {x.paired} | {x.a_only} | {x.b_only} | "
                    f"{_p(x.p)} | {_p(x.p_holm)} |"
                )
        lines.append("")
    if provenance:
        lines += ["## Provenance", "", *(line for p in provenance for line in p.lines()), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- html: the same tables as a heat map


def _colour(v: float) -> tuple[str, str]:
    """A white-to-blue ramp (readable in greyscale and by colour-blind readers) and its text colour."""
    lo, hi = np.array([247, 251, 255]), np.array([8, 81, 156])
    r, g, b = (lo + (hi - lo) * v).round().astype(int)
    return f"rgb({r},{g},{b})", "#fff" if v > 0.55 else "#111"


def _html_cell(c: StudyCell) -> str:
    title = escape(c.text(), quote=True)
    if c.rejected:
        return f'<td class="rej" title="{title}"><b>rej</b><small>{escape(c.cause())}</small></td>'
    if not c.scored:
        return f'<td class="none" title="{title}">{escape(c.text())}</td>'
    bg, fg = _colour(c.call.pooled)
    mean = c.episode_text()
    return (
        f'<td class="v" style="background:{bg};color:{fg}" title="{title}"><b>call {escape(c.headline())}</b>'
        f"<small>delivered {escape(c.delivered_text())}</small>"
        + (f"<small>{escape(mean)}</small>" if mean else "")
        + "</td>"
    )


def _axis_name(x: str | None) -> str:
    return escape(str(x) if x is not None else HARNESS_MODEL)


def _html_table(caption: str, head: str, rows, columns, cell) -> str:
    out = [
        f"<table><caption>{escape(caption)}</caption><tr><th>{escape(head)}</th>",
        *(f"<th>{_axis_name(c)}</th>" for c in columns),
        "</tr>",
    ]
    for row in rows:
        out += [f"<tr><th>{_axis_name(row)}</th>", *(_html_cell(cell(row, c)) for c in columns), "</tr>"]
    return "".join(out) + "</table>"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#111}
table{border-collapse:collapse;margin:1em 0 2em}caption{text-align:left;font-weight:600;padding:.3em 0}
th,td{border:1px solid #999;padding:.4em .7em;text-align:center;vertical-align:middle}
td b{display:block;font-size:1.1em}td small{display:block;font-size:.8em}
td.rej{background:repeating-linear-gradient(45deg,#ddd,#ddd 6px,#bbb 6px,#bbb 12px);max-width:16em}
td.none{color:#888}
.key span{display:inline-block;padding:.2em .6em;margin-right:.5em;border:1px solid #999}
"""


def render_html(t: StudyTables, provenance: list | None = None) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Study {escape(t.name)}</title>"
        f"<style>{_CSS}</style></head><body><h1>Study {escape(t.name)}</h1>",
        f"<p>{escape(_key(t.seed)[0]).replace('**', '')}</p>"
        "<p>Colour: call fidelity (white 0% to dark blue 100%). Hatched grey: <b>rej</b>, every turn a "
        "non-response (the stack refused; the model never ran).</p>",
        "<p class='key'>"
        + "".join(
            f"<span style='background:{_colour(v)[0]};color:{_colour(v)[1]}'>{v:.0%}</span>"
            for v in (0, 0.25, 0.5, 0.75, 1)
        )
        + "</p>",
    ]
    for stack in t.stacks:
        caption = (
            f"Models x conditions, stack {stack} ({t.upstreams[stack]})"
            if stack
            else f"Models x conditions, {t.upstreams[stack]}"
        )
        parts.append(_html_table(caption, "model", t.models, t.conditions, lambda m, c, s=stack: t.cell(s, m, c)))
    if len(t.stacks) > 1 or t.stacks[0] is not None:
        for condition in t.conditions:
            parts.append(
                _html_table(
                    f"Stacks x models, condition {condition}",
                    "stack",
                    t.stacks,
                    t.models,
                    lambda s, m, c=condition: t.cell(s, m, c),
                )
            )
    if t.tests:
        rows = "".join(
            f"<tr><td>{escape(x.family)}</td><td>{escape(x.within)}</td><td>{escape(x.a)}</td><td>{escape(x.b)}</td>"
            + (
                f"<td colspan=5>{escape(x.note)}</td>"
                if x.note
                else f"<td>{x.paired}</td><td>{x.a_only}</td><td>{x.b_only}</td>"
                f"<td>{_p(x.p)}</td><td>{_p(x.p_holm)}</td>"
            )
            + "</tr>"
            for x in t.tests
        )
        parts.append(
            "<table><caption>Paired tests over the same items (exact McNemar on the delivered verdict, "
            "Holm within each family)</caption><tr><th>family</th><th>within</th><th>A</th><th>B</th>"
            f"<th>paired</th><th>A only</th><th>B only</th><th>p</th><th>p (Holm)</th></tr>{rows}</table>"
        )
    parts.append(provenance_section(provenance or []))
    return "".join(parts) + "</body></html>\n"


def render_json(t: StudyTables, provenance: list | None = None) -> str:
    def rate(r: stats.Rate | None):
        return (
            None
            if r is None
            else {
                "episode_mean": r.episode_mean,
                "ci_low": r.ci_low,
                "ci_high": r.ci_high,
                "interval_note": r.interval_note,
                "episodes": r.episodes_rated,
                "pooled": r.pooled,
                "numerator": r.numerator,
                "denominator": r.denominator,
            }
        )

    cells = [
        {
            "stack": c.stack,
            "model": c.model,
            "condition": c.condition,
            "runs": list(c.runs),
            "turns": c.turns,
            "rejected": c.rejected,
            "delivered_fidelity": rate(c.delivered),
            "call_fidelity": rate(c.call),
            "non_responses": c.non_responses,
            "cause": c.cause() or None,
            "text": c.text(),
        }
        for c in t.cells.values()
    ]
    doc = {
        "study": t.name,
        "upstreams": {k or "": v for k, v in t.upstreams.items()},
        "models": t.models,
        "conditions": t.conditions,
        "seed": t.seed,
        "cells": cells,
        "tests": [x.__dict__ for x in t.tests],
        "provenance": [p.as_dict() for p in provenance or []],
    }
    return json.dumps(doc, indent=2) + "\n"


RENDERERS = {"markdown": render_markdown, "table": render_markdown, "html": render_html, "json": render_json}
