"""How a number reads to a person: the cells and notes shared by the table, markdown and HTML.

One place decides that an undefined rate reads "rej" (every turn a non-response) or "-" (nothing
to rate), never 0%, and how an interval is written, so no human-facing format can drift from
another.
"""

from __future__ import annotations

from toolproxy.analysis.classify.outcomes import (
    ANALYZER_VERSION,
    NON_RESPONSE_OWNER,
    NON_RESPONSE_WORDS,
    ROLES,
    SERVING,
    UNKNOWN,
)
from toolproxy.analysis.measure.runline import sides_text
from toolproxy.analysis.measure.stats import MIN_EPISODES, NO_SPREAD, TOO_FEW_EPISODES, Rate
from toolproxy.analysis.measure.summary import NON_RESPONSE_KINDS, Report, RunSummary

REJ = "rej"
NONE = "-"
LOST = "lost in the serving layer: calls left in text"
KEPT = "calls kept from the harness on items expecting none"
# The run table leads with the two headline numbers side by side, then the gap between them; the
# model's restraint and the restraint the harness saw sit side by side the same way.
HEADERS = (
    "run",
    "stack",
    "model",
    "condition",
    "turns",
    "episodes",
    "call fidelity [95% CI]",
    "delivered fidelity [95% CI]",
    "lost in serving",
    "restraint [95% CI]",
    "delivered restraint [95% CI]",
    "answer rate",
    "paper fidelity",
    "non-response",
    "as text",
    "loops",
)
# The terminal's headline table, headed tersely so it fits in 100 columns; the rest goes in DETAIL_HEADERS.
SHORT_HEADERS = (
    "run",
    "cond",
    "turns",
    "eps",
    "call [95% CI]",
    "dlv [95% CI]",
    "lost",
    "restr",
    "dlv restr",
    "answered",
    "nonresp",
)
# Each header says what its cells count, on the spot: a newcomer reads it without the legend.
DETAIL_HEADERS = (
    "run",
    "stack",
    "model",
    "turns by role",
    "call, mean/ep",
    "valid/turns",
    "in text",
    "loops",
)
FIRST_NUMERIC = 4
SHORT_FIRST_NUMERIC = 2
DETAIL_FIRST_NUMERIC = 4
OUTCOME_LABELS = {
    "valid_call": "valid call",
    "invalid_args": "invalid arguments",
    "hallucinated_call": "hallucinated tool",
    "unparseable": "unparseable call",
    "prose": "prose (no call)",
    "non_response": "non-response",
}


def pct(x: float | None, digits: int = 0) -> str:
    if x is None:
        return NONE
    return f"{100 * x:.{digits}f}%"


def _undefined(s: RunSummary) -> str:
    return REJ if s.rejected else NONE


def rate_cell(s: RunSummary, r: Rate, digits: int = 0, interval: bool = True) -> str:
    """Pooled rate with its Wilson 95% interval, e.g. "62% [41-80]"; "rej" or "-" when undefined."""
    if r.pooled is None:
        return _undefined(s)
    if not interval:
        return pct(r.pooled, digits)
    low, high = (f"{100 * x:.{digits}f}" for x in (r.wilson_low, r.wilson_high))
    return f"{pct(r.pooled, digits)} [{low}-{high}]"


# Why a per-episode mean has no interval, in words.
_NO_INTERVAL = {
    TOO_FEW_EPISODES: f"too few for an interval: it takes {MIN_EPISODES}",
    NO_SPREAD: "every one scored the same: no interval",
}


def episode_cell(s: RunSummary, r: Rate, digits: int = 0, compact: bool = False) -> str:
    """The per-episode mean, labelled with the episodes it is over (those where the rate is
    defined, e.g. 2 of a run's 5): "50% (2/5 eps)", or at length "50% over 2 of 5 episodes (too
    few for an interval ...)"; with its bootstrap interval only from MIN_EPISODES such episodes."""
    if r.episode_mean is None:
        return _undefined(s)
    total = r.episodes_rated + r.episodes_unrated
    ci = ""
    if r.ci_low is not None:
        low, high = (f"{100 * x:.{digits}f}" for x in (r.ci_low, r.ci_high))
        ci = f" [{low}-{high}]"
    if compact:
        return f"{pct(r.episode_mean, digits)}{ci} ({r.episodes_rated}/{total} eps)"
    note = f" ({_NO_INTERVAL.get(r.interval_note, r.interval_note)})" if r.interval_note else ""
    return f"{pct(r.episode_mean, digits)}{ci} over {r.episodes_rated} of {total} episodes{note}"


def lost_cell(s: RunSummary, digits: int = 0) -> str:
    return pct(s.lost_in_serving, digits) if s.lost_in_serving is not None else _undefined(s)


def stack_cell(s: RunSummary, version: bool = True) -> str:
    return " ".join(x for x in (s.stack, s.stack_version if version else None) if x) or NONE


def roles_cell(s: RunSummary) -> str:
    """ "8 call, 8 answer, 2 abstain": the turns of each role there are, named."""
    return ", ".join(f"{s.roles[r]} {ROLE_WORDS[r]}" for r in ROLES if s.roles.get(r)) or NONE


ROLE_WORDS = {"call": "call", "answer": "answer", "abstain": "abstain", "open": "open", "no_tools": "no tools"}


def row(s: RunSummary, digits: int = 0) -> list[str]:
    """The human cells of one run, in HEADERS order."""
    return [
        s.run,
        stack_cell(s),
        s.model or NONE,
        s.condition or NONE,
        str(s.turns),
        str(s.episodes),
        rate_cell(s, s.call_fidelity, digits),
        rate_cell(s, s.delivered_fidelity, digits),
        lost_cell(s, digits),
        rate_cell(s, s.restraint, digits),
        rate_cell(s, s.delivered_restraint, digits),
        rate_cell(s, s.answer_rate, digits),
        rate_cell(s, s.paper_fidelity, digits, interval=False),
        pct(s.non_response_rate.pooled, digits),
        pct(s.surfaced_as_text, digits),
        str(s.looping_episodes),
    ]


def short_row(s: RunSummary) -> list[str]:
    """The terminal's headline cells, in SHORT_HEADERS order."""
    return [
        s.run,
        s.condition or NONE,
        str(s.turns),
        str(s.episodes),
        rate_cell(s, s.call_fidelity),
        rate_cell(s, s.delivered_fidelity),
        lost_cell(s),
        rate_cell(s, s.restraint, interval=False),
        rate_cell(s, s.delivered_restraint, interval=False),
        rate_cell(s, s.answer_rate, interval=False),
        pct(s.non_response_rate.pooled),
    ]


def detail_row(s: RunSummary) -> list[str]:
    """The terminal's second table, in DETAIL_HEADERS order; a model's hub organisation is dropped."""
    model = s.model.rsplit("/", 1)[-1] if s.model else NONE
    return [
        s.run,
        stack_cell(s, False),
        model,
        roles_cell(s),
        episode_cell(s, s.call_fidelity, compact=True),
        rate_cell(s, s.paper_fidelity, interval=False),
        pct(s.surfaced_as_text),
        str(s.looping_episodes),
    ]


def kinds_text(kinds: dict[str, int], retries: dict[str, int] | None = None) -> str:
    """ "refused 3 (after 12 retries), timeout 1": the cause first, the retries beside it."""
    retries = retries or {}
    ordered = [k for k in NON_RESPONSE_KINDS if k in kinds] + sorted(k for k in kinds if k not in NON_RESPONSE_KINDS)
    return ", ".join(f"{k} {kinds[k]}" + (f" (after {retries[k]} retries)" if retries.get(k) else "") for k in ordered)


def causes_text(kinds: dict[str, int], retries: dict[str, int] | None = None) -> str:
    """The non-responses by whose they are, each cause in words: "serving layer: refused 2 (the
    stack refused the request before the model ran); model: model_stopped 1 (...)". An empty reply
    the model or the harness made is never read as the server's failure."""
    by_owner: dict[str, dict[str, int]] = {}
    for k, n in kinds.items():
        by_owner.setdefault(NON_RESPONSE_OWNER.get(k, UNKNOWN), {})[k] = n
    parts = []
    for owner, mine in sorted(by_owner.items(), key=lambda kv: (kv[0] != SERVING, kv[0] == UNKNOWN)):
        text = kinds_text(mine, retries)
        words = "; ".join(NON_RESPONSE_WORDS[k] for k in NON_RESPONSE_KINDS if k in mine)
        parts.append(f"{owner if owner != UNKNOWN else 'cause unknown'}: {text}" + (f" ({words})" if words else ""))
    return "; ".join(parts)


def run_notes(s: RunSummary) -> list[str]:
    """What a reader must not miss about a run, in the order a diagnosis asks: did the serving
    layer refuse, did it lose calls in text, and only then what the model did."""
    notes = []
    if s.replay_of:
        notes.append(
            f"a replay of {s.replay_of}'s turns, open-loop (each turn sent with the original history, not "
            f"the replayed answers; each turn its own episode): `compare {s.replay_of} {s.run}` pairs them turn by turn"
        )
    if s.sampling is not None:
        notes.append(sampled_note(s))
    kinds = causes_text(s.non_response_kinds, s.non_response_retries)
    if s.turns == 0:
        notes.append("no turns recorded")
    elif s.rejected:
        served = all(NON_RESPONSE_OWNER.get(k) == SERVING for k in s.non_response_kinds)
        notes.append(
            f"every turn was a non-response ({kinds}): no metric is defined ({REJ}), "
            + ("the model's output never reached the harness" if served else "no turn produced output")
        )
    elif s.non_response_rate.numerator:
        notes.append(f"{s.non_response_rate.numerator} non-responses kept out of every metric ({kinds})")
    if s.lost_in_serving:
        n = s.call_fidelity.numerator - s.delivered_fidelity.numerator
        notes.append(
            f"{LOST}: {n} of {s.call_fidelity.denominator} turns due a call held a valid call the harness "
            f"never got as a call ({pct(s.lost_in_serving)}; no or wrong tool parser on the stack?)"
        )
    kept = s.delivered_restraint.numerator - s.restraint.numerator
    if kept:
        notes.append(
            f"{KEPT}: {kept} of {s.restraint.denominator} turns of items expecting no call attempted a call "
            f"that never reached the harness (left in text; restraint {pct(s.restraint.pooled)}, delivered "
            f"restraint {pct(s.delivered_restraint.pooled)})"
        )
    if s.roles.get("open"):
        notes.append(
            f"{s.roles['open']} open turns (prose ending an episode that saw no tool result, item expectation "
            "unknown): not scored; tag items expect=call|none or pass --expect"
        )
    if s.looping_episodes:
        notes.append(f"{s.looping_episodes} looping episodes")
    if s.subagent_episodes or s.compactions:
        parts = []
        if s.subagent_episodes:
            parts.append(
                f"{s.subagent_episodes} subagent episode{'s' * (s.subagent_episodes != 1)} under the calls "
                "that started them"
            )
        if s.compactions:
            parts.append(f"{s.compactions} compaction{'s' * (s.compactions != 1)} the task went on after")
        notes.append(f"{s.episodes} tasks, each counted once: " + ", ".join(parts))
    if s.ttft_median_ms is not None and s.ttfb_median_ms is not None and s.ttft_median_ms > s.ttfb_median_ms + 1000:
        notes.append(
            f"first token {s.ttft_median_ms / 1000:,.1f} s after the request (median), first byte "
            f"{s.ttfb_median_ms:,.0f} ms: the stack sent keep-alive comments, not tokens, while it worked"
        )
    if s.side_requests:
        notes.append(f"side requests (not turns): {sides_text(s.side_requests)}")
    if s.unplaced:
        notes.append(
            f"{s.unplaced} request{'s' * (s.unplaced != 1)} not placed in a task (alone, without tools, "
            "beside tasks with tools: a side request toolproxy does not know?)"
        )
    return notes


def sampled_note(s: RunSummary) -> str:
    """`--sample`: what share was kept, the totals the counts stand for, and what was only counted."""
    sm = s.sampling
    rate = f"{100 * sm.rate_min:g}%" + ("" if sm.rate_min == sm.rate_max else f" to {100 * sm.rate_max:g}%")
    return (
        f"sampled at {rate} of episodes: {s.turns} turns in {s.episodes} episodes stored stand for an estimated "
        f"{sm.estimated_turns:,.0f} turns in {sm.estimated_episodes:,.0f} episodes ({sm.exchanges_not_stored} "
        "exchanges of the others forwarded and counted, not stored); rates are estimates from the kept episodes"
    )


def report_notes(report: Report) -> list[tuple[str, str]]:
    """One line per run that has something to say."""
    return [(s.run, "; ".join(notes)) for s in report.runs if (notes := run_notes(s))]


def provenance(report: Report) -> str:
    analyzed = (
        f"analyzer v{report.analyzer_version}" if report.analyzer_version is not None else "analyzer version unknown"
    )
    stale = (
        f" (this toolproxy's analyzer is v{ANALYZER_VERSION}: run `toolproxy analyze` to rebuild)"
        if report.stale
        else ""
    )
    rules = f" · expectation rules: {', '.join(report.expect_rules)}" if report.expect_rules else ""
    return (
        f"source {report.source} · toolproxy {report.toolproxy_version} · {analyzed}{stale} · "
        f"generated {report.generated_at}{rules} · pooled rates: Wilson 95% CI; per-episode means: episode "
        f"bootstrap, {report.resamples:,} resamples, seed {report.seed}, "
        f"only with at least {MIN_EPISODES} episodes"
    )


def legend() -> str:
    """What the headline columns mean, in the words docs/metrics.md#the-metrics uses."""
    return (
        "call fidelity = valid calls / turns due a call (any surface), pooled over the run's turns, with its "
        "Wilson 95% interval: the headline; delivered (dlv) = of those, calls the harness "
        "got as calls; lost = the difference, calls left in text by the serving layer. restraint (restr) = "
        "turns of items expecting no call that attempted none (any surface); delivered restraint (dlv restr) = those "
        "where "
        "no call reached the harness (a call left in text did not); answered = episodes ending in an answer after "
        "a tool "
        "result. Turns by role: call = due a call, answer = prose after a tool result, abstain = an item expecting "
        "no call, open = prose ending an episode with no tool result and no expectation (not scored). call, mean/ep "
        "= call fidelity with each episode weighted equally, over the episodes due a call (k/N eps); its bootstrap "
        f"interval only from {MIN_EPISODES} such episodes. valid/turns = valid calls / all produced turns (the "
        "original study's paper fidelity); in text = share of calls that came as text; loops = looping episodes. "
        f"{REJ} = every turn was a non-response."
    )
