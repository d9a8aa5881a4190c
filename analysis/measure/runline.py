"""A run, and an exchange, in one line: the way the report reads them, for every view that sums up.

`toolproxy run` and `study` print a run's line from the report's JSON; the live page and serve's
line per exchange build theirs from the live classifier's counts. All go through here, so none can
tell another story: call fidelity with delivered beside it, a valid call the harness got only as
text counted as lost (never as a success), and a run whose every turn was a non-response read as
`rej` with its cause and whose it is, never as n/a or 0%.

Pure: plain values in, text and plain dicts out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolproxy.analysis.classify.outcomes import (
    HARNESS,
    MODEL,
    NON_RESPONSE,
    NON_RESPONSE_OWNER,
    NON_RESPONSE_WORDS,
    SERVING,
    SUB_KINDS,
    UNKNOWN,
    USER,
    VALID_CALL,
    whose,
)

REJ = "rej"
CAUSE_CHARS = 120
# The proxy's error kinds a classification carries as its detail when the record said nothing more.
_ERROR_NAMES = ("connect", "timeout", "upstream_closed", "client_closed")


@dataclass(frozen=True)
class Share:
    """k of n, with the pooled rate's interval when the report computed one."""

    k: int
    n: int
    low: float | None = None
    high: float | None = None

    @property
    def rate(self) -> float | None:
        return self.k / self.n if self.n else None

    def text(self, undefined: str = "-") -> str:
        if not self.n:
            return undefined
        ci = f" [{self.low * 100:.0f}-{self.high * 100:.0f}]" if self.low is not None and self.high is not None else ""
        return f"{self.k / self.n:.0%}{ci} ({self.k}/{self.n})"


@dataclass(frozen=True)
class RunLine:
    """What one line says of a run, counted in turns (a harness's retries of one request are one
    turn) whether the report or the live page counted them."""

    run: str
    total: int  # turns
    call: Share  # valid calls / those due a call
    delivered: Share  # of those, the calls that reached the harness as calls
    non_responses: dict[str, int] = field(default_factory=dict)
    causes: dict[str, str] = field(default_factory=dict)  # sub-kind -> the record's words for it
    episodes: int | None = None
    answers: Share | None = None  # episodes ending in an answer / those with a call, answer or open turn
    # what the harness asked for itself beside its tasks, by kind (analysis.classify.sides): no turns
    side_requests: dict[str, int] = field(default_factory=dict)

    @property
    def rejected(self) -> bool:
        """Every one was a non-response: no rate is defined, and none reads 0%."""
        return self.total > 0 and sum(self.non_responses.values()) >= self.total

    @property
    def lost(self) -> int:
        """Valid calls the harness never got as calls: left in the reply text."""
        return max(0, self.call.k - self.delivered.k)

    def cause(self) -> str:
        """The non-responses in words, the most frequent first: "refused 2: tools param requires
        --jinja flag (a serving failure)"."""
        return "; ".join(cause_text(kind, n, self.causes.get(kind)) for kind, n in _ordered(self.non_responses))

    def cells(self) -> dict:
        """The parts a table or a page shows: call, delivered, lost, and the verdict (rej or None)."""
        undefined = REJ if self.rejected else "-"
        return {
            "call": self.call.text(undefined),
            "delivered": self.delivered.text(undefined),
            "answered": (self.answers or Share(0, 0)).text(undefined),
            "lost": self.lost,
            "verdict": REJ if self.rejected else None,
            "non_responses": sum(self.non_responses.values()),
            "cause": self.cause() or None,
        }

    def text(self) -> str:
        head = (
            f"run {self.run}: "
            + (f"{plural(self.episodes, 'episode')}, " if self.episodes is not None else "")
            + plural(self.total, "turn")
        )
        if self.total == 0:
            return head + ": nothing classified yet" + self.sides()
        if self.rejected:
            return f"{head}: {REJ}: every one a non-response, no rate is defined ({self.cause()})" + self.sides()
        out = f"{head} ({self.call.n} due a call); call fidelity {self.call.text()}, delivered {self.delivered.text()}"
        if self.lost:
            out += f"; {self.lost} valid call{'s' if self.lost != 1 else ''} left in text, lost in serving"
        if self.answers is not None:
            out += f"; answered {self.answers.text()}"
        n = sum(self.non_responses.values())
        out += f"; non-responses {n}" + (f" ({self.cause()})" if n else "")
        return out + self.sides()

    def sides(self) -> str:
        """ "; side requests: 1 title, 1 prewarm" when the harness made any (empty otherwise)."""
        return f"; side requests: {sides_text(self.side_requests)}" if self.side_requests else ""


def sides_text(sides: dict[str, int]) -> str:
    """Side requests by kind, the most frequent first: "3 prewarm, 1 title"."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(sides.items(), key=lambda kv: (-kv[1], kv[0])))


def plural(n: int, noun: str) -> str:
    """ "1 turn", "2 turns": a count a person reads."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ordered(kinds: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(
        kinds.items(), key=lambda kv: (-kv[1], SUB_KINDS.index(kv[0]) if kv[0] in SUB_KINDS else len(SUB_KINDS))
    )


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= CAUSE_CHARS else text[: CAUSE_CHARS - 3] + "..."


def cause_text(kind: str, n: int | None = None, said: str | None = None) -> str:
    """One non-response cause: its name (and count), what the record said or the cause in words,
    and whose it is."""
    # A record whose error has no words of its own carries its kind's name ("connect"): say the kind in words.
    words = _cut(said) if said and said not in (kind, *_ERROR_NAMES) else NON_RESPONSE_WORDS.get(kind, kind)
    return f"{kind}{f' {n}' if n is not None else ''}: {words} ({whose(kind)})"


def share_of(rate) -> Share:
    """A pooled rate (analysis.measure.stats.Rate) as the line writes it: every table that shows a
    run's or a cell's headline goes through here, so none prints another number for it."""
    return Share(rate.numerator, rate.denominator, rate.wilson_low, rate.wilson_high)


def _share(metric: dict | None) -> Share:
    m = metric or {}
    return Share(
        int(m.get("numerator") or 0), int(m.get("denominator") or 0), m.get("wilson_low"), m.get("wilson_high")
    )


def from_report(run: dict) -> RunLine:
    """A run of `report --format json`."""
    return RunLine(
        run["run"],
        int(run.get("turns") or 0),
        _share(run.get("call_fidelity")),
        _share(run.get("delivered_fidelity")),
        dict(run.get("non_response_kinds") or {}),
        dict(run.get("non_response_causes") or {}),
        run.get("episodes"),
        _share(run.get("answer_rate")),
        dict(run.get("side_requests") or {}),
    )


# ---------------------------------------------------------------- one exchange, as it happens


def delivered_now(outcome: str | None, harness_saw_prose: bool | None) -> bool | None:
    """Whether an exchange's valid call reached the harness as a call when it was answered (None:
    no valid call). A call left in the text did not; the report counts it delivered only once the
    harness's next request shows it parsed the text and acted on it (analysis.episodes.roles.delivered)."""
    if outcome != VALID_CALL:
        return None
    return not harness_saw_prose


def exchange_text(summary: dict) -> str:
    """An exchange's outcome for serve's log line: "valid_call/native: delivered", "valid_call/text:
    left in text, the harness got prose", "non_response/refused: <the stack's words> (a serving failure)"."""
    outcome = summary.get("outcome")
    if not outcome:
        return "not a model turn"
    if outcome == NON_RESPONSE:
        return f"{NON_RESPONSE}/{cause_text(summary.get('sub_kind') or 'empty', None, summary.get('detail'))}"
    key = f"{outcome}/{summary['surface']}" if summary.get("surface") else outcome
    got = summary.get("delivered")
    if got is True:
        return f"{key}: delivered"
    if got is False:
        return f"{key}: left in text, the harness got prose (lost unless it parses text itself)"
    return key


def composition_key(outcome: str | None, sub_kind: str | None, surface: str | None) -> str | None:
    """outcome/surface for a produced turn or exchange, non_response/sub-kind for a non-response
    (as the report splits them)."""
    if not outcome:
        return None
    detail = sub_kind if outcome == NON_RESPONSE else surface
    return f"{outcome}/{detail}" if detail else outcome


# What a turn's outcome looks like in a composition bar: a valid call that reached the harness is
# the one success; one left in the text is drawn apart, as lost; non-responses by whose they are.
SEGMENTS = (
    ("delivered", "valid call, delivered"),
    ("lost", "valid call left in text (lost in serving)"),
    ("invalid_args", "invalid arguments"),
    ("hallucinated_call", "hallucinated tool"),
    ("unparseable", "unparseable call"),
    ("prose", "prose (no call)"),
    ("nr-serving", "non-response: a serving failure"),
    ("nr-model", "non-response: the model ended its turn with nothing"),
    ("nr-harness", "non-response: the harness's stop string cut the reply"),
    ("nr-user", "non-response: the user interrupted the harness"),
    ("nr-unknown", "non-response: cause unknown"),
)
_OWNER_SEGMENT = {SERVING: "nr-serving", MODEL: "nr-model", HARNESS: "nr-harness", USER: "nr-user"}


def segments(outcomes: dict[str, int], delivered: int) -> list[dict]:
    """The bar of `outcomes` ("outcome/surface" or "non_response/sub_kind" keys -> count): each
    segment's key, label and count, in SEGMENTS order, empty ones left out."""
    n: dict[str, int] = dict.fromkeys((k for k, _ in SEGMENTS), 0)
    for key, count in outcomes.items():
        outcome, _, detail = key.partition("/")
        if outcome == NON_RESPONSE:
            n[_OWNER_SEGMENT.get(NON_RESPONSE_OWNER.get(detail, UNKNOWN), "nr-unknown")] += count
        elif outcome == VALID_CALL:
            n["lost"] += count
        elif outcome in n:
            n[outcome] += count
    moved = min(delivered, n["lost"])
    n["delivered"], n["lost"] = moved, n["lost"] - moved
    return [{"key": k, "label": label, "n": n[k]} for k, label in SEGMENTS if n[k]]
