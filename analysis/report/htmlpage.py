"""The HTML report: one self-contained file (inline CSS and SVG, no script, no network).

It must open years later on an air-gapped machine exactly as it did today, so nothing is fetched:
the charts are SVG drawn here, the stylesheet is inlined, fonts are the system's.
"""

from __future__ import annotations

from html import escape
from importlib import resources

from analysis.report.cells import (FIRST_NUMERIC, HEADERS, OUTCOME_LABELS, LOST, REJ, episode_cell, legend, pct, rate_cell,
                                   provenance, report_notes, row)
from analysis.summary import OUTCOMES, Report, RunSummary

# Okabe-Ito palette: distinguishable with every common colour-vision deficiency. Non-responses get
# a dark grey with white hatching so they can never be mistaken for a model outcome.
COLOURS = {
    "valid_call": "#009E73",
    "invalid_args": "#E69F00",
    "hallucinated_call": "#D55E00",
    "unparseable": "#CC79A7",
    "prose": "#56B4E9",
    "non_response": "#3B3B3B",
}
_OTHER = "#999999"
_SEEN_AS_PROSE = "#b9eadb"
_MEAN = "#0072B2"

_WIDTH = 1040
_LABEL = 250   # left column: run name and what it measured
_ROW = 46
_BAR = 24
_TOP = 10
_AXIS = 30


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _fill(outcome: str) -> str:
    return "url(#hatch)" if outcome == "non_response" else COLOURS.get(outcome, _OTHER)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _run_label(s: RunSummary, y: float) -> str:
    """Run name over what it measured, clipped to the label column; the full text is the tooltip."""
    detail = " · ".join(x for x in (s.model, s.condition, s.stack) if x)
    return (f'<g><title>{_e(s.run)}: {_e(detail)}</title>'
            f'<text x="0" y="{y + 10:.1f}" class="run">{_e(_clip(s.run, 28))}</text>'
            f'<text x="0" y="{y + 26:.1f}" class="detail">{_e(_clip(detail, 38))}</text></g>')


def _axis(x0: float, span: float, height: float) -> str:
    parts = []
    for tick in (0, 25, 50, 75, 100):
        x = x0 + span * tick / 100
        parts.append(f'<line x1="{x:.1f}" y1="{_TOP - 4}" x2="{x:.1f}" y2="{height}" class="grid"/>'
                     f'<text x="{x:.1f}" y="{height + 16}" class="tick">{tick}%</text>')
    return "".join(parts)


def _svg(title: str, desc: str, height: float, body: str) -> str:
    total = height + _AXIS
    slug = title.lower().replace(" ", "-")
    return (f'<svg viewBox="0 0 {_WIDTH} {total:.0f}" width="100%" role="img" aria-labelledby="{slug}-t {slug}-d" '
            f'><title id="{slug}-t">{_e(title)}</title>'
            f'<desc id="{slug}-d">{_e(desc)}</desc>{body}</svg>')


def _seen_as_prose(s: RunSummary, right: float, w: float, y: float) -> str:
    """Striped over the right end of the valid-call segment: valid calls the stack left in the text,
    so the harness got prose. The signature of a stack without a tool parser must be visible."""
    return (f'<rect x="{right - w:.2f}" y="{y}" width="{w:.2f}" height="{_BAR}" fill="url(#seen-prose)" class="segment">'
            f'<title>{_e(s.run)}: {s.valid_seen_as_prose} valid calls the harness saw as prose '
            f'(left in the text by the stack)</title></rect>')


def composition_chart(report: Report) -> str:
    """A 100% stacked bar per run: every turn is in exactly one segment, non-responses included."""
    x0, span = _LABEL, _WIDTH - _LABEL - 10
    height = _TOP + _ROW * len(report.runs)
    parts = ['<defs><pattern id="hatch" width="8" height="8" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
             f'<rect width="8" height="8" fill="{COLOURS["non_response"]}"/>'
             '<line x1="0" y1="0" x2="0" y2="8" stroke="#ffffff" stroke-width="2" stroke-opacity="0.45"/></pattern>'
             f'<pattern id="seen-prose" width="5" height="5" patternUnits="userSpaceOnUse">'
             f'<rect width="5" height="5" fill="{COLOURS["valid_call"]}"/>'
             f'<line x1="4" y1="0" x2="4" y2="5" stroke="{_SEEN_AS_PROSE}" stroke-width="2"/></pattern></defs>',
             _axis(x0, span, height)]
    for i, s in enumerate(report.runs):
        y = _TOP + i * _ROW
        parts.append(_run_label(s, y))
        if not s.turns:
            parts.append(f'<text x="{x0 + 6}" y="{y + 17}" class="none">no turns recorded</text>')
            continue
        x = x0
        for outcome, n in s.outcomes.items():
            if not n:
                continue
            w = span * n / s.turns
            share = pct(n / s.turns, 1)
            label = OUTCOME_LABELS.get(outcome, outcome)
            parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{_BAR}" fill="{_fill(outcome)}" class="segment">'
                         f'<title>{_e(s.run)}: {_e(label)}, {n} of {s.turns} turns ({share})</title></rect>')
            if outcome == "valid_call" and s.valid_seen_as_prose:
                parts.append(_seen_as_prose(s, x + w, span * s.valid_seen_as_prose / s.turns, y))
            if w >= 44:
                cls = "seg light" if outcome == "non_response" else "seg"
                parts.append(f'<text x="{x + w / 2:.2f}" y="{y + 16.5}" class="{cls}">{share}</text>')
            x += w
    desc = "; ".join(f"{s.run}: " + ", ".join(f"{OUTCOME_LABELS.get(k, k)} {n}" for k, n in s.outcomes.items() if n)
                     for s in report.runs)
    return _svg("Outcome composition", desc, height, "".join(parts))


def _pooled_marker(x: float, mid: float) -> str:
    """A hollow diamond drawn under the mean's dot and larger than it, so both show when they coincide."""
    return f'<path d="M{x:.2f} {mid - 10} l10 10 l-10 10 l-10 -10 z" class="pooled"/>'


def rate_chart(report: Report, metric: str, title: str) -> str:
    """One metric per run: the pooled rate (diamond) with its Wilson 95% whisker, and the
    per-episode mean (dot) beside it."""
    x0, span = _LABEL, 470
    text_x = x0 + span + 28
    height = _TOP + _ROW * len(report.runs)
    parts = [_axis(x0, span, height)]
    for i, s in enumerate(report.runs):
        y = _TOP + i * _ROW
        mid = y + _BAR / 2
        parts.append(_run_label(s, y))
        r = getattr(s, metric)
        if r.pooled is None:
            why = "every turn was a non-response" if s.rejected else "no turn to rate"
            parts.append(f'<text x="{x0 + 6}" y="{mid + 5:.1f}" class="rej">{REJ if s.rejected else "-"}: {_e(why)}</text>')
            continue
        lo, hi = (x0 + span * v for v in (r.wilson_low, r.wilson_high))
        dot = f'<circle cx="{x0 + span * r.episode_mean:.2f}" cy="{mid}" r="6" fill="{_MEAN}"/>' if r.episode_mean is not None else ""
        parts.append(f'<g><title>{_e(s.run)}: {_e(rate_cell(s, r, 1))}, per-episode mean {_e(episode_cell(s, r, 1))}, '
                     f'{r.numerator} of {r.denominator}</title>'
                     f'<line x1="{lo:.2f}" y1="{mid}" x2="{hi:.2f}" y2="{mid}" class="whisker"/>'
                     f'<line x1="{lo:.2f}" y1="{mid - 7}" x2="{lo:.2f}" y2="{mid + 7}" class="whisker"/>'
                     f'<line x1="{hi:.2f}" y1="{mid - 7}" x2="{hi:.2f}" y2="{mid + 7}" class="whisker"/>'
                     f'{_pooled_marker(x0 + span * r.pooled, mid)}{dot}</g>')
        parts.append(f'<text x="{text_x}" y="{mid + 5:.1f}" class="value">{_e(rate_cell(s, r, 1))}'
                     f'<tspan class="detail"> · {r.numerator}/{r.denominator} · per episode {_e(episode_cell(s, r, 1))}</tspan></text>')
    desc = "; ".join(f"{s.run}: {rate_cell(s, getattr(s, metric), 1)}" for s in report.runs)
    return _svg(title, desc, height, "".join(parts))


def _legend(report: Report) -> str:
    items = "".join(f'<li><span class="swatch {k}" style="background:{COLOURS[k]}"></span>{_e(OUTCOME_LABELS[k])}</li>'
                    for k in OUTCOMES)
    if any(s.valid_seen_as_prose for s in report.runs):
        items += '<li><span class="swatch seen_as_prose"></span>valid call the harness saw as prose (stack did not parse it)</li>'
    return f'<ul class="legend" aria-label="outcome colours">{items}</ul>'


def _run_table(report: Report) -> str:
    head = "".join(f'<th scope="col"{" class=num" if i >= FIRST_NUMERIC else ""}>{_e(h)}</th>' for i, h in enumerate(HEADERS))
    body = []
    for s in report.runs:
        run, *rest = row(s, digits=1)
        cells = [f'<th scope="row">{_e(run)}</th>']
        for i, c in enumerate(rest, start=1):
            classes = [name for name, on in (("num", i >= FIRST_NUMERIC), ("rej", c == REJ), ("wrap", HEADERS[i] == "stack")) if on]
            cells.append(f'<td class="{" ".join(classes)}">{_e(c)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table><caption>One row per run</caption><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _counts_table(report: Report) -> str:
    keys = list(dict.fromkeys(k for s in report.runs for k in s.outcomes))
    head = "".join(f'<th scope="col" class="num">{_e(OUTCOME_LABELS.get(k, k))}</th>' for k in keys)
    body = "".join("<tr><th scope=row>" + _e(s.run) + "</th>" +
                   "".join(f'<td class="num">{s.outcomes[k]}</td>' for k in keys) + "</tr>" for s in report.runs)
    return (f'<table class="counts"><caption>Turn counts behind the bars</caption>'
            f'<thead><tr><th scope="col">run</th>{head}</tr></thead><tbody>{body}</tbody></table>')


def render(report: Report) -> str:
    css = resources.files("analysis.report").joinpath("report.css").read_text(encoding="utf-8")
    notes = "".join(f"<li><strong>{_e(run)}</strong>: {_e(note)}</li>" for run, note in report_notes(report))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>toolproxy report</title>
<style>{css}</style></head>
<body><main>
<h1>toolproxy report</h1>
<p class="meta">{_e(provenance(report))}</p>
<section><h2>Runs</h2>{_run_table(report)}
<p class="help">{_e(legend())}</p></section>
{f'<section><h2>Notes</h2><ul class="notes">{notes}</ul></section>' if notes else ""}
<section><h2>Outcome composition</h2>
<p class="help">Share of all turns per outcome. Non-responses (refusals, server errors, timeouts: the model's output
never reached the harness) are hatched grey and always shown.</p>
{_legend(report)}{composition_chart(report)}
<details><summary>Counts</summary>{_counts_table(report)}</details></section>
<section><h2>Call and delivered fidelity per run</h2>
<p class="help"><span class="key diamond"></span> pooled over turns with its 95% Wilson interval &nbsp;
<span class="key dot"></span> per-episode mean. Where delivered falls short of call fidelity, the calls were {_e(LOST)}.</p>
{rate_chart(report, "call_fidelity", "Call fidelity per run")}
{rate_chart(report, "delivered_fidelity", "Delivered fidelity per run")}</section>
</main></body></html>
"""
