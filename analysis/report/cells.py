"""How a number reads to a person: the cells and notes shared by the table, markdown and HTML.

One place decides that an undefined fidelity reads "rej" (every turn a non-response) or "-" (no
turns at all), never 0%, so no human-facing format can drift from another.
"""

from __future__ import annotations

from analysis.summary import NON_RESPONSE_KINDS, Report, RunSummary

REJ = "rej"
NONE = "-"

HEADERS = ("run", "stack", "model", "condition", "turns", "episodes", "fidelity [95% CI]", "pooled",
           "non-response", "as text", "loops")
# The same columns, headed tersely so the terminal table fits in 100 columns.
SHORT_HEADERS = ("run", "stack", "model", "cond", "turns", "eps", "fidelity [CI]", "pooled", "nonresp", "text",
                 "loops")
FIRST_NUMERIC = 4

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


def fidelity_cell(s: RunSummary, digits: int = 0) -> str:
    """Per-episode mean with its bootstrap CI, e.g. "62% [41-80]"."""
    f = s.fidelity
    if f.episode_mean is None:
        return _undefined(s)
    low, high = (f"{100 * x:.{digits}f}" for x in (f.ci_low, f.ci_high))
    return f"{pct(f.episode_mean, digits)} [{low}-{high}]"


def pooled_cell(s: RunSummary, digits: int = 0) -> str:
    return pct(s.fidelity.pooled, digits) if s.fidelity.pooled is not None else _undefined(s)


def stack_cell(s: RunSummary, version: bool = True) -> str:
    return " ".join(x for x in (s.stack, s.stack_version if version else None) if x) or NONE


def row(s: RunSummary, digits: int = 0, compact: bool = False) -> list[str]:
    """The human cells of one run. compact (the terminal) drops the stack version and a model's
    hub organisation ("Qwen/Qwen3-8B" -> "Qwen3-8B") to stay within 100 columns."""
    model = (s.model.rsplit("/", 1)[-1] if compact else s.model) if s.model else NONE
    return [s.run, stack_cell(s, not compact), model, s.condition or NONE, str(s.turns), str(s.episodes),
            fidelity_cell(s, digits), pooled_cell(s, digits), pct(s.fidelity.non_response_rate, digits),
            pct(s.surfaced_as_text, digits), str(s.looping_episodes)]


def kinds_text(kinds: dict[str, int]) -> str:
    ordered = [k for k in NON_RESPONSE_KINDS if k in kinds] + sorted(k for k in kinds if k not in NON_RESPONSE_KINDS)
    return ", ".join(f"{k} {kinds[k]}" for k in ordered)


def run_notes(s: RunSummary) -> list[str]:
    """What a reader must not miss about a run, in the order SPEC section 8 diagnoses it."""
    notes = []
    f = s.fidelity
    if s.turns == 0:
        notes.append("no turns recorded")
    elif s.rejected:
        notes.append(f"every turn was a non-response ({kinds_text(s.non_response_kinds)}): no fidelity ({REJ}), "
                     "the model's output never reached the harness")
    elif f.non_responses:
        notes.append(f"{f.non_responses} non-responses kept out of fidelity ({kinds_text(s.non_response_kinds)})")
    if s.harness_saw_prose:
        notes.append(f"{s.harness_saw_prose} turns the harness saw as prose held a valid call in the text "
                     "(no or wrong tool parser on the stack?)")
    if f.episodes_unrated and not s.rejected:
        notes.append(f"{f.episodes_unrated} episodes with no produced turn left out of the per-episode mean")
    if s.looping_episodes:
        notes.append(f"{s.looping_episodes} looping episodes")
    return notes


def report_notes(report: Report) -> list[tuple[str, str]]:
    """One line per run that has something to say."""
    return [(s.run, "; ".join(notes)) for s in report.runs if (notes := run_notes(s))]


def provenance(report: Report) -> str:
    return (f"source {report.source} · toolproxy {report.toolproxy_version} · generated {report.generated_at} · "
            f"fidelity CI: episode bootstrap, {report.resamples:,} resamples, seed {report.seed}")
