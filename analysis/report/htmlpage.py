"""The HTML report: one self-contained file (inline CSS and SVG, no script, no network).

It must open years later on an air-gapped machine exactly as it did today, so nothing is fetched:
the charts are SVG drawn here, the stylesheet is inlined, fonts are the system's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from html import escape
from importlib import resources

import toolproxy.analysis.report.comparison as comparison
from toolproxy.analysis.classify.outcomes import NON_RESPONSE_WORDS, whose
from toolproxy.analysis.measure import stats
from toolproxy.analysis.measure.compare import METRIC_HELP
from toolproxy.analysis.measure.stats import Rate
from toolproxy.analysis.measure.summary import NON_RESPONSE_KINDS, OUTCOMES, Report, RunSummary
from toolproxy.analysis.report.cells import (
    FIRST_NUMERIC,
    HEADERS,
    KEPT,
    LOST,
    OUTCOME_LABELS,
    REJ,
    episode_cell,
    legend,
    pct,
    provenance,
    rate_cell,
    report_notes,
    row,
)
from toolproxy.analysis.report.details import MAX_TREES, TURN_COLUMNS, Count, PageDetails, RunUsage, TaskNode
from toolproxy.analysis.report.provenance import Provenance

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
# Each non-response cause its own grey and hatch direction, so a refusal and a timeout read apart
# in the bar while every cause still reads as "never reached the harness".
_KIND_HATCH = {
    kind: (("#2b2b2b", "#5c5c5c")[i // 4 % 2], (45, -45, 0, 90)[i % 4]) for i, kind in enumerate(NON_RESPONSE_KINDS)
}
# Fidelity cells: white at 0% to the Okabe-Ito blue at 100%.
_LOW, _HIGH = (255, 255, 255), (0, 114, 178)
_SEEN_AS_PROSE = "#b9eadb"
_MEAN = "#0072B2"

_WIDTH = 1040
_LABEL = 250  # left column: run name and what it measured
_ROW = 46
_BAR = 24
_TOP = 10
_AXIS = 30
_SPAN = 470  # the 0-100% axis of a rate chart
_VALUE_X = _LABEL + _SPAN + 28  # where its numbers are written


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _fill(outcome: str, kind: str | None = None) -> str:
    if outcome != "non_response":
        return COLOURS.get(outcome, _OTHER)
    return f"url(#hatch-{kind})" if kind in _KIND_HATCH else "url(#hatch)"


def _hatch(pattern_id: str, grey: str, angle: int) -> str:
    return (
        f'<pattern id="{pattern_id}" width="8" height="8" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate({angle})"><rect width="8" height="8" fill="{grey}"/>'
        '<line x1="0" y1="0" x2="0" y2="8" stroke="#ffffff" stroke-width="2" stroke-opacity="0.45"/></pattern>'
    )


def _segments(s: RunSummary) -> list[tuple[str, str | None, int]]:
    """(outcome, non-response cause, turns) in bar order: a non-response segment per cause."""
    out = []
    for outcome, n in s.outcomes.items():
        if outcome != "non_response":
            out.append((outcome, None, n))
            continue
        kinds = s.non_response_kinds
        ordered = [k for k in NON_RESPONSE_KINDS if kinds.get(k)] + sorted(
            k for k in kinds if k not in NON_RESPONSE_KINDS
        )
        out += [(outcome, k, kinds[k]) for k in ordered]
        out.append((outcome, None, n - sum(kinds.values())))
    return [seg for seg in out if seg[2] > 0]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _run_label(s: RunSummary, y: float) -> str:
    """Run name over what it measured, clipped to the label column; the full text is the tooltip."""
    detail = " · ".join(x for x in (s.model, s.condition, s.stack) if x)
    return (
        f"<g><title>{_e(s.run)}: {_e(detail)}</title>"
        f'<text x="0" y="{y + 10:.1f}" class="run">{_e(_clip(s.run, 28))}</text>'
        f'<text x="0" y="{y + 26:.1f}" class="detail">{_e(_clip(detail, 38))}</text></g>'
    )


def _axis(x0: float, span: float, height: float) -> str:
    parts = []
    for tick in (0, 25, 50, 75, 100):
        x = x0 + span * tick / 100
        parts.append(
            f'<line x1="{x:.1f}" y1="{_TOP - 4}" x2="{x:.1f}" y2="{height}" class="grid"/>'
            f'<text x="{x:.1f}" y="{height + 16}" class="tick">{tick}%</text>'
        )
    return "".join(parts)


def _svg(title: str, desc: str, height: float, body: str) -> str:
    total = height + _AXIS
    slug = title.lower().replace(" ", "-")
    return (
        f'<svg viewBox="0 0 {_WIDTH} {total:.0f}" width="100%" role="img" aria-labelledby="{slug}-t {slug}-d" '
        f'><title id="{slug}-t">{_e(title)}</title>'
        f'<desc id="{slug}-d">{_e(desc)}</desc>{body}</svg>'
    )


def _seen_as_prose(s: RunSummary, right: float, w: float, y: float) -> str:
    """Striped over the right end of the valid-call segment: valid calls the stack left in the text,
    so the harness got prose. The signature of a stack without a tool parser must be visible."""
    return (
        f'<rect x="{right - w:.2f}" y="{y}" width="{w:.2f}" height="{_BAR}" fill="url(#seen-prose)" class="segment">'
        f"<title>{_e(s.run)}: {s.valid_seen_as_prose} valid calls the harness saw as prose "
        f"(left in the text by the stack)</title></rect>"
    )


def composition_chart(report: Report) -> str:
    """A 100% stacked bar per run: every turn is in exactly one segment, non-responses included."""
    x0, span = _LABEL, _WIDTH - _LABEL - 10
    height = _TOP + _ROW * len(report.runs)
    hatches = "".join(
        _hatch(f"hatch-{k}", grey, angle)
        for k, (grey, angle) in _KIND_HATCH.items()
        if any(s.non_response_kinds.get(k) for s in report.runs)
    )
    parts = [
        f"<defs>{_hatch('hatch', COLOURS['non_response'], 45)}{hatches}"
        f'<pattern id="seen-prose" width="5" height="5" patternUnits="userSpaceOnUse">'
        f'<rect width="5" height="5" fill="{COLOURS["valid_call"]}"/>'
        f'<line x1="4" y1="0" x2="4" y2="5" stroke="{_SEEN_AS_PROSE}" stroke-width="2"/></pattern></defs>',
        _axis(x0, span, height),
    ]
    for i, s in enumerate(report.runs):
        y = _TOP + i * _ROW
        parts.append(_run_label(s, y))
        if not s.turns:
            parts.append(f'<text x="{x0 + 6}" y="{y + 17}" class="none">no turns recorded</text>')
            continue
        x = x0
        for outcome, kind, n in _segments(s):
            w = span * n / s.turns
            share = pct(n / s.turns, 1)
            label = OUTCOME_LABELS.get(outcome, outcome) + (f" ({kind})" if kind else "")
            parts.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{_BAR}" fill="{_fill(outcome, kind)}" '
                'class="segment">'
                f"<title>{_e(s.run)}: {_e(label)}, {n} of {s.turns} turns ({share})</title></rect>"
            )
            if outcome == "valid_call" and s.valid_seen_as_prose:
                parts.append(_seen_as_prose(s, x + w, span * s.valid_seen_as_prose / s.turns, y))
            text = f"{kind} {share}" if kind and w >= 9 * (len(kind) + len(share)) else share
            if w >= 44:
                cls = "seg light" if outcome == "non_response" else "seg"
                parts.append(f'<text x="{x + w / 2:.2f}" y="{y + 16.5}" class="{cls}">{_e(text)}</text>')
            x += w
    desc = "; ".join(
        f"{s.run}: " + ", ".join(f"{OUTCOME_LABELS.get(o, o)}{f' ({k})' if k else ''} {n}" for o, k, n in _segments(s))
        for s in report.runs
    )
    return _svg("Outcome composition", desc, height, "".join(parts))


def _pooled_marker(x: float, mid: float) -> str:
    """A hollow diamond drawn under the mean's dot and larger than it, so both show when they coincide."""
    return f'<path d="M{x:.2f} {mid - 10} l10 10 l-10 10 l-10 -10 z" class="pooled"/>'


def _rate_rows(
    report: Report, rate_of: Callable[[RunSummary], Rate], nothing: str, draw: Callable[[RunSummary, float], str]
) -> tuple[float, str]:
    """(height, body) of a per-run rate chart: the axis, each run's label, then draw(run, middle
    y) or, when the run's rate is undefined, why ("rej" when every turn was a non-response)."""
    height = _TOP + _ROW * len(report.runs)
    parts = [_axis(_LABEL, _SPAN, height)]
    for i, s in enumerate(report.runs):
        y = _TOP + i * _ROW
        mid = y + _BAR / 2
        parts.append(_run_label(s, y))
        if rate_of(s).pooled is None:
            why = "every turn was a non-response" if s.rejected else nothing
            parts.append(
                f'<text x="{_LABEL + 6}" y="{mid + 5:.1f}" class="rej">{REJ if s.rejected else "-"}: {_e(why)}</text>'
            )
        else:
            parts.append(draw(s, mid))
    return height, "".join(parts)


def rate_chart(report: Report, metric: str, title: str) -> str:
    """One metric per run: the pooled rate (diamond) with its Wilson 95% whisker, and the
    per-episode mean (dot) beside it."""
    x0, span = _LABEL, _SPAN

    def draw(s: RunSummary, mid: float) -> str:
        r = getattr(s, metric)
        lo, hi = (x0 + span * v for v in (r.wilson_low, r.wilson_high))
        dot = (
            f'<circle cx="{x0 + span * r.episode_mean:.2f}" cy="{mid}" r="6" fill="{_MEAN}"/>'
            if r.episode_mean is not None
            else ""
        )
        return (
            f"<g><title>{_e(s.run)}: {_e(rate_cell(s, r, 1))}, per-episode mean {_e(episode_cell(s, r, 1))}, "
            f"{r.numerator} of {r.denominator}</title>"
            f'<line x1="{lo:.2f}" y1="{mid}" x2="{hi:.2f}" y2="{mid}" class="whisker"/>'
            f'<line x1="{lo:.2f}" y1="{mid - 7}" x2="{lo:.2f}" y2="{mid + 7}" class="whisker"/>'
            f'<line x1="{hi:.2f}" y1="{mid - 7}" x2="{hi:.2f}" y2="{mid + 7}" class="whisker"/>'
            f"{_pooled_marker(x0 + span * r.pooled, mid)}{dot}</g>"
            f'<text x="{_VALUE_X}" y="{mid - 1:.1f}" class="value">{_e(rate_cell(s, r, 1))}'
            f'<tspan class="detail"> · {r.numerator}/{r.denominator}</tspan></text>'
            f'<text x="{_VALUE_X}" y="{mid + 14:.1f}" class="detail">per episode {_e(episode_cell(s, r, 1))}</text>'
        )

    height, body = _rate_rows(report, lambda s: getattr(s, metric), "no turn to rate", draw)
    desc = "; ".join(f"{s.run}: {rate_cell(s, getattr(s, metric), 1)}" for s in report.runs)
    return _svg(title, desc, height, body)


def _legend(report: Report) -> str:
    items = "".join(
        f'<li><span class="swatch {k}" style="background:{COLOURS[k]}"></span>{_e(OUTCOME_LABELS[k])}</li>'
        for k in OUTCOMES
    )
    kinds = [k for k in _KIND_HATCH if any(s.non_response_kinds.get(k) for s in report.runs)]
    items += "".join(
        f'<li><span class="swatch hatch" style="--grey:{_KIND_HATCH[k][0]};--angle:{_KIND_HATCH[k][1] + 90}deg">'
        f"</span>non-response: {_e(k)} ({_e(NON_RESPONSE_WORDS[k])}: {_e(whose(k))})</li>"
        for k in kinds
    )
    if any(s.valid_seen_as_prose for s in report.runs):
        items += (
            '<li><span class="swatch seen_as_prose"></span>valid call the harness saw as prose (stack did not '
            "parse it)</li>"
        )
    return f'<ul class="legend" aria-label="outcome colours">{items}</ul>'


def _run_table(report: Report) -> str:
    head = "".join(
        f'<th scope="col"{" class=num" if i >= FIRST_NUMERIC else ""}>{_e(h)}</th>' for i, h in enumerate(HEADERS)
    )
    body = []
    for s in report.runs:
        run, *rest = row(s, digits=1)
        cells = [f'<th scope="row">{_e(run)}</th>']
        for i, c in enumerate(rest, start=1):
            classes = [
                name
                for name, on in (("num", i >= FIRST_NUMERIC), ("rej", c == REJ), ("wrap", HEADERS[i] == "stack"))
                if on
            ]
            cells.append(f'<td class="{" ".join(classes)}">{_e(c)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="scroll"><table class="runs"><caption>One row per run</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _counts_table(report: Report) -> str:
    keys = list(dict.fromkeys(k for s in report.runs for k in s.outcomes))
    head = "".join(f'<th scope="col" class="num">{_e(OUTCOME_LABELS.get(k, k))}</th>' for k in keys)
    body = "".join(
        "<tr><th scope=row>"
        + _e(s.run)
        + "</th>"
        + "".join(f'<td class="num">{s.outcomes[k]}</td>' for k in keys)
        + "</tr>"
        for s in report.runs
    )
    return (
        f'<table class="counts"><caption>Turn counts behind the bars</caption>'
        f'<thead><tr><th scope="col">run</th>{head}</tr></thead><tbody>{body}</tbody></table>'
    )


_CALL, _DELIVERED, _GAP = "#0072B2", "#009E73", "#D55E00"


def headline_chart(report: Report) -> str:
    """Call and delivered fidelity of each run on one axis, the gap between them drawn and named:
    what the model got right, what the harness received, and what the serving layer lost."""
    x0, span = _LABEL, _SPAN

    def draw(s: RunSummary, mid: float) -> str:
        call, dlv = s.call_fidelity, s.delivered_fidelity
        xc, xd = x0 + span * call.pooled, x0 + span * dlv.pooled
        lost = s.lost_in_serving or 0.0
        title = f"{s.run}: call fidelity {rate_cell(s, call, 1)}, delivered {rate_cell(s, dlv, 1)}" + (
            f"; {pct(lost, 1)} {LOST}" if lost > 0 else ""
        )
        gap = (
            f'<line x1="{xd:.2f}" y1="{mid}" x2="{xc:.2f}" y2="{mid}" stroke="{_GAP}" stroke-width="6" class="gap"/>'
            if xc - xd > 0.5
            else ""
        )
        words = (
            f'<tspan fill="{_CALL}">call {pct(call.pooled)}</tspan> · <tspan fill="{_DELIVERED}">delivered '
            f"{pct(dlv.pooled)}</tspan>"
        )
        if lost > 0:
            words += f' · <tspan fill="{_GAP}">lost {pct(lost)}</tspan>'
        return (
            f'<g><title>{_e(title)}</title><line x1="{x0}" y1="{mid}" x2="{x0 + span}" y2="{mid}" class="track"/>'
            f'{gap}<circle cx="{xd:.2f}" cy="{mid}" r="7" fill="{_DELIVERED}"/>'
            f'<circle cx="{xc:.2f}" cy="{mid}" r="8" fill="none" stroke="{_CALL}" stroke-width="3"/></g>'
            f'<text x="{_VALUE_X}" y="{mid + 5:.1f}" class="value">{words}</text>'
        )

    height, body = _rate_rows(report, lambda s: s.call_fidelity, "no turn was due a call", draw)
    desc = "; ".join(
        f"{s.run}: call {rate_cell(s, s.call_fidelity)}, delivered {rate_cell(s, s.delivered_fidelity)}"
        for s in report.runs
    )
    return _svg("Call and delivered fidelity", desc, height, body)


def _rate_fill(rate: float) -> tuple[str, str]:
    """(background, text colour) of a fidelity cell."""
    r, g, b = (round(lo + (hi - lo) * rate) for lo, hi in zip(_LOW, _HIGH))
    return f"#{r:02x}{g:02x}{b:02x}", ("#ffffff" if rate >= 0.55 else "#111111")


_CELL_W = (_WIDTH - _LABEL - 10) / TURN_COLUMNS


def turn_index_chart(report: Report, by_turn: dict[str, list[Count]]) -> str:
    """One row of cells per run, one cell per turn position: does fidelity hold up as episodes grow?"""
    x0 = _LABEL
    top = _TOP + 18
    height = top + _ROW * len(report.runs)
    parts = []
    for j in range(TURN_COLUMNS):
        label = f"turn {j + 1}" if j < TURN_COLUMNS - 1 else f"{TURN_COLUMNS}+"
        parts.append(f'<text x="{x0 + _CELL_W * (j + 0.5):.1f}" y="{_TOP + 4}" class="tick">{label}</text>')
    for i, s in enumerate(report.runs):
        y = top + i * _ROW
        parts.append(_run_label(s, y))
        for j, c in enumerate(by_turn.get(s.run, ())):
            x = x0 + _CELL_W * j
            where = f"turn {j + 1}" if j < TURN_COLUMNS - 1 else f"turns {TURN_COLUMNS} and later"
            if not c.n:
                parts.append(
                    f'<rect x="{x + 2:.1f}" y="{y}" width="{_CELL_W - 4:.1f}" height="{_BAR + 8}" class="empty">'
                    f"<title>{_e(s.run)}, {where}: no turn due a call</title></rect>"
                )
                continue
            fill, ink = _rate_fill(c.call)
            below = f"n={c.n}" if c.d == c.k else f"dlv {pct(c.delivered)} · n={c.n}"
            parts.append(
                f"<g><title>{_e(s.run)}, {where}: {_e(_count_text(c))}</title>"
                f'<rect x="{x + 2:.1f}" y="{y}" width="{_CELL_W - 4:.1f}" height="{_BAR + 8}" fill="{fill}" '
                'class="cell"/>'
                f'<text x="{x + _CELL_W / 2:.1f}" y="{y + 14}" class="cellv" fill="{ink}">{pct(c.call)}</text>'
                f'<text x="{x + _CELL_W / 2:.1f}" y="{y + 27}" class="celln" fill="{ink}">{below}</text></g>'
            )
    desc = "; ".join(
        f"{s.run}: " + ", ".join(f"turn {j + 1}: {_count_text(c)}" for j, c in enumerate(by_turn.get(s.run, ())) if c.n)
        for s in report.runs
    )
    return _svg("Fidelity by turn index", desc, height, "".join(parts))


def _count_text(c: Count) -> str:
    return (
        f"{c.k} of {c.n} turns due a call held a valid call ({pct(c.call, 1)}), "
        f"{c.d} delivered it to the harness ({pct(c.delivered, 1)})"
    )


def _count_cell(c: Count | None) -> str:
    if c is None or not c.n:
        return '<td class="num muted">-</td>'
    fill, ink = _rate_fill(c.call)
    delivered = "" if c.d == c.k else f' <span class="of">· {pct(c.delivered)} delivered</span>'
    return (
        f'<td class="num rate" style="background:{fill};color:{ink}" title="{_e(_count_text(c))}">{pct(c.call)}'
        f'{delivered} <span class="of">{c.k}/{c.n}</span></td>'
    )


def category_table(report: Report, details: PageDetails) -> str:
    head = "".join(f'<th scope="col" class="num">{_e(s.run)}</th>' for s in report.runs)
    body = "".join(
        f'<tr><th scope="row">{_e(cat)}</th>'
        + "".join(_count_cell(details.by_category.get((s.run, cat))) for s in report.runs)
        + "</tr>"
        for cat in details.categories
    )
    return (
        '<div class="scroll"><table class="grid"><caption>Call fidelity per category (valid calls / turns due a '
        "call), and delivered where it differs"
        f'</caption><thead><tr><th scope="col">category</th>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    )


def comparison_tables(details: PageDetails) -> str:
    """One row per pair of runs, both discordant counts beside p (Holm-adjusted across the pairs
    when there are several), and each pair's per-category rows folded beneath."""
    pairs = details.comparisons
    holm = stats.holm([c.overall.p for c in pairs]) if len(pairs) > 1 else [None] * len(pairs)
    heads = ("A", "B", *comparison.COLUMNS[1:-1], "Holm p (pairs)" if len(pairs) > 1 else None)
    head = "".join(f'<th scope="col"{" class=num" if i > 1 else ""}>{_e(h)}</th>' for i, h in enumerate(heads) if h)
    body = []
    for c, p_holm in zip(pairs, holm):
        cells = [c.run_a, c.run_b, *comparison.rows(c)[-1][1 : len(comparison.COLUMNS) - 1]]
        if len(pairs) > 1:
            cells.append(comparison.p_text(p_holm))
        body.append(
            "<tr>" + "".join(f"<td{' class=num' if i > 1 else ''}>{_e(v)}</td>" for i, v in enumerate(cells)) + "</tr>"
        )
    metric = pairs[0].metric
    out = [
        f'<p class="help">Runs over the same items, paired by item. Metric {_e(metric)}: {_e(METRIC_HELP[metric])}. '
        "Exact two-sided McNemar test on the discordant items (A only vs B only).</p>",
        f'<div class="scroll"><table class="paired"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
        "</table></div>",
    ]
    by_category = []
    for c in pairs:
        if not c.categories:
            continue
        cols = comparison.columns(c)
        chead = "".join(f'<th scope="col"{" class=num" if i else ""}>{_e(h)}</th>' for i, h in enumerate(cols))
        rows = "".join(
            "<tr>" + "".join(f"<td{' class=num' if i else ''}>{_e(v)}</td>" for i, v in enumerate(r)) + "</tr>"
            for r in comparison.rows(c)
        )
        by_category.append(
            f'<h3>{_e(c.run_a)} vs {_e(c.run_b)}</h3><div class="scroll"><table class="paired">'
            f"<thead><tr>{chead}</tr></thead><tbody>{rows}</tbody></table></div>"
        )
    if by_category:
        out.append(
            "<details><summary>Each pair by category (Holm-adjusted across its categories)</summary>"
            f"{''.join(by_category)}</details>"
        )
    if details.pairs_left_out:
        out.append(
            f'<p class="help">{details.pairs_left_out} more pairs of runs share items; compare them with '
            "<code>toolproxy compare RUN_A RUN_B</code>.</p>"
        )
    return "".join(out)


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 10:
        return f"{x:.1f} ms"
    return f"{x:,.0f} ms" if x < 1000 else f"{x / 1000:,.1f} s"


def _tokens(total: int, per: int) -> str:
    return f"{total:,} ({total / per:,.0f}/request)" if per else "-"


def usage_table(report: Report, usage: dict[str, RunUsage]) -> str:
    heads = (
        "run",
        "answered",
        "TTFB p50",
        "TTFB p95",
        "total p50",
        "total p95",
        "prompt tokens",
        "completion tokens",
        "cached tokens",
    )
    head = "".join(f'<th scope="col"{" class=num" if i else ""}>{h}</th>' for i, h in enumerate(heads))
    body = []
    for s in report.runs:
        u = usage.get(s.run)
        if u is None:
            body.append(
                f'<tr><th scope="row">{_e(s.run)}</th><td colspan="{len(heads) - 1}" class="muted">no '
                "attempts</td></tr>"
            )
            continue
        cached = "-" if u.cached_tokens is None else f"{u.cached_tokens:,} ({pct(u.cached_share)} of prompt)"
        cells = (
            str(u.answered),
            _ms(u.ttfb_p50_ms),
            _ms(u.ttfb_p95_ms),
            _ms(u.total_p50_ms),
            _ms(u.total_p95_ms),
            _tokens(u.prompt_tokens, u.reported),
            _tokens(u.completion_tokens, u.reported),
            cached,
        )
        body.append(
            f'<tr><th scope="row">{_e(s.run)}</th>' + "".join(f'<td class="num">{_e(c)}</td>' for c in cells) + "</tr>"
        )
    return (
        f'<div class="scroll"><table><caption>Latency over the attempts the model answered; tokens as the stack '
        f"reported them (per request = per attempt that reported usage)</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def restraint_section(report: Report) -> str:
    """Restraint and delivered restraint per run, drawn only when some run has items expecting no call."""
    if not any(s.restraint.denominator for s in report.runs):
        return ""
    return (
        '<section><h2>Restraint and delivered restraint per run</h2><p class="help">Turns of items expecting no '
        "call (e.g. BFCL irrelevance). <b>Restraint</b>: the model attempted no call, on any surface. "
        "<b>Delivered restraint</b>: no call reached the harness, as a benchmark scoring what it received sees "
        f"it. Where delivered restraint is higher, the difference is {_e(KEPT)}: calls left in the reply text.</p>"
        f"<h3>Restraint</h3>{rate_chart(report, 'restraint', 'Restraint per run')}"
        f"<h3>Delivered restraint</h3>{rate_chart(report, 'delivered_restraint', 'Delivered restraint per run')}"
        "</section>"
    )


def _tree_list(tree: list[TaskNode]) -> str:
    """A task's tree (depth first) as nested lists: each episode under the one that started it."""
    html, depth = "<ul>", 0
    for i, node in enumerate(tree):
        if i:
            html += "</li>" if node.depth <= depth else "<ul>"
            html += "</ul></li>" * (depth - node.depth)
        depth = node.depth
        turns = f"{node.turns} turn{'s' * (node.turns != 1)}"
        html += f"<li><code>{_e(node.episode)}</code>: {_e(node.how)}, {turns}"
    return html + "</li></ul>" * (depth + 1)


def tasks_section(d: PageDetails) -> str:
    """The tasks with subagents or compactions, each as its tree: the report counts each once."""
    trees = [(run, tree) for run, ts in d.tasks.items() for tree in ts]
    if not trees:
        return ""
    items = "".join(f"<li><strong>{_e(run)}</strong>{_tree_list(tree)}</li>" for run, tree in trees)
    return (
        '<section><h2>Tasks with subagents or compactions</h2><p class="help">Each task is counted once: a '
        "subagent's episode under the call that started it, the episode a task went on with after a compaction "
        f"under the one it went on from (at most the first {MAX_TREES} tasks per run).</p>"
        f'<ul class="notes">{items}</ul></section>'
    )


def _details_sections(report: Report, d: PageDetails) -> str:
    parts = [
        '<section><h2>Fidelity by turn index</h2><p class="help">Call fidelity at each position of an episode '
        "(valid calls / turns due a call there, n), with delivered fidelity (dlv) where calls were lost. A fall "
        "to the right means the model loses the protocol as the conversation grows.</p>",
        turn_index_chart(report, d.by_turn),
        "</section>",
    ]
    if d.categories:
        parts += [
            '<section><h2>By category</h2><p class="help">Category: the <code>category</code> tag, else the '
            "item key's prefix (<code>simple_12</code> is <code>simple</code>).</p>",
            category_table(report, d),
            "</section>",
        ]
    if d.comparisons:
        parts += ["<section><h2>Paired comparisons</h2>", comparison_tables(d), "</section>"]
    parts += ["<section><h2>Latency and tokens</h2>", usage_table(report, d.usage), "</section>"]
    parts.append(tasks_section(d))
    return "".join(parts)


def provenance_section(origins: Iterable[Provenance]) -> str:
    """Per run what produced its number (analysis.report.provenance), its "why" line first: the
    reader of a chart asks that before the stack's version."""
    items = "".join(
        f'<li><strong>{_e(p.run)}</strong>: <span class="why">{_e(p.why)}</span><br>'
        f'<span class="help">{_e(p.facts())}</span></li>'
        for p in origins
    )
    if not items:
        return ""
    return (
        '<section><h2>Provenance</h2><p class="help">Per run: the model the stack served (and the one requested '
        "where they differ), the stack and its version, whose parser delivered the calls, the chat template, the "
        f'sampling the harness sent, prompt-cache hits, and why the number is what it is.</p><ul class="notes">{items}'
        "</ul></section>"
    )


def render(report: Report, details: PageDetails | None = None, origins: Iterable[Provenance] = ()) -> str:
    """The page; `details` (analysis.report.details.page_details) adds the sections only it can fill,
    `origins` (analysis.report.provenance) each run's provenance."""
    css = resources.files("toolproxy.analysis.report").joinpath("report.css").read_text(encoding="utf-8")
    notes = "".join(f"<li><strong>{_e(run)}</strong>: {_e(note)}</li>" for run, note in report_notes(report))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>toolproxy report</title>
<style>{css}</style></head>
<body><main>
<h1>toolproxy report</h1>
<p class="meta">{_e(provenance(report))}</p>
<section><h2>Call and delivered fidelity</h2>
<p class="help"><span class="key ring"></span> <b>call fidelity</b>: valid calls / turns due a call, whatever the
surface &nbsp; <span class="key green"></span> <b>delivered</b>: of those, calls the harness received as calls &nbsp;
<span class="key gap"></span> the gap: {_e(LOST)}.</p>
{headline_chart(report)}</section>
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
<span class="key dot"></span> per-episode mean.
Where delivered falls short of call fidelity, the calls were {_e(LOST)}.</p>
<h3>Call fidelity</h3>
{rate_chart(report, "call_fidelity", "Call fidelity per run")}
<h3>Delivered fidelity</h3>
{rate_chart(report, "delivered_fidelity", "Delivered fidelity per run")}</section>
{restraint_section(report)}
{_details_sections(report, details) if details is not None else ""}
{provenance_section(origins)}
</main></body></html>
"""
