"""The outcome and role vocabulary (docs/analysis.md, docs/metrics.md), shared by the analyzer that assigns it
and the reports that count it; kept apart from classify so a report does not load the call validators."""

# The version of the rules that turn raw records into outcomes, roles and metrics. Every derived
# row records the version that produced it, and `toolproxy analyze` rebuilds every derived table
# from the stored raw bodies when the store was analysed under another version, so old and new
# rules are never mixed. The rule: bump it in the same commit as any change to classification
# (attempt.py, the call parsers), to turns/episodes/roles (episodes/) or to what a metric counts.
ANALYZER_VERSION = 8

NON_RESPONSE = "non_response"
HALLUCINATED = "hallucinated_call"
INVALID_ARGS = "invalid_args"
VALID_CALL = "valid_call"
UNPARSEABLE = "unparseable"
PROSE = "prose"
# In the order classification decides them.
OUTCOMES = (NON_RESPONSE, HALLUCINATED, INVALID_ARGS, VALID_CALL, UNPARSEABLE, PROSE)
# Why nothing reached the harness. A turn the harness retried keeps its cause (the last attempt's);
# the number of attempts is kept beside it, so retries never hide a refusal. The serving layer's
# failures first; then the two empty replies that are nobody's failure in the serving layer: the
# model ended its turn at once (its end token, no text), or a stop string the harness itself sent
# cut the reply before any text. Those count where the original study counts an empty model turn
# (a non-response, out of every fidelity denominator) but are never blamed on the server.
MODEL_STOPPED = "model_stopped"
STOP_STRING = "stop_string"
# The client closed the connection before any token reached it: the harness gave up waiting (its
# timeout: Claude Code's API_TIMEOUT_MS, its 300 s stream idle watchdog) or its user stopped it.
# Not a stream the stack cut (`truncated`): the stack may still have been processing the prompt.
CLIENT_GAVE_UP = "client_gave_up"
# The user interrupted the harness (Ctrl-C under `toolproxy run` or `study`) while the request was
# in flight: the record's error kind of the same name (toolproxy.record.model.USER_INTERRUPT).
USER_INTERRUPT = "user_interrupt"
SUB_KINDS = (
    "refused",
    "http_4xx",
    "http_5xx",
    "timeout",
    "connect",
    "swallowed",
    "empty",
    "truncated",
    MODEL_STOPPED,
    STOP_STRING,
    CLIENT_GAVE_UP,
    USER_INTERRUPT,
)
# The sub-kinds of a complete 200 reply that held nothing (a harness may write that nothing into
# its history, and its next request continues from it).
EMPTY_REPLIES = frozenset({"empty", "swallowed", MODEL_STOPPED, STOP_STRING})
# Whose a non-response is: the serving layer's (the model never ran, or its output was lost), the
# model's, or the harness's. `empty` says nothing either way (no token count, no stop reason).
SERVING, MODEL, HARNESS, USER, UNKNOWN = "serving layer", "model", "harness", "user", "unknown"
NON_RESPONSE_OWNER = {
    "refused": SERVING,
    "http_4xx": SERVING,
    "http_5xx": SERVING,
    "timeout": SERVING,
    "connect": SERVING,
    "swallowed": SERVING,
    "truncated": SERVING,
    "empty": UNKNOWN,
    MODEL_STOPPED: MODEL,
    STOP_STRING: HARNESS,
    CLIENT_GAVE_UP: HARNESS,
    USER_INTERRUPT: USER,
}
# Each cause in words, for the report's notes, `show` and the live page.
NON_RESPONSE_WORDS = {
    "refused": "the stack refused the request before the model ran",
    "http_4xx": "the stack answered an HTTP 4xx error",
    "http_5xx": "the stack answered an HTTP 5xx error",
    "timeout": "no answer in time",
    "connect": "the stack could not be reached",
    "swallowed": "the model generated text the stack did not deliver",
    "empty": "an empty reply with nothing in the record to say why",
    "truncated": "the stream was cut before any content",
    MODEL_STOPPED: "the model ended its turn at once (its end token, no text)",
    STOP_STRING: "a stop string the harness sent cut the reply before any text",
    CLIENT_GAVE_UP: "the harness stopped waiting before any token came (its timeout, or its user stopped it)",
    USER_INTERRUPT: "the user interrupted the harness while the request was in flight",
}

# What a produced turn was for (non-responses have no role: the model's output never arrived).
NO_TOOLS = "no_tools"
ANSWER = "answer"
ABSTAIN = "abstain"
CALL = "call"
OPEN = "open"
ROLES = (CALL, ANSWER, ABSTAIN, OPEN, NO_TOOLS)
# What an item expects, from its `expect` tag or an analyst's rule.
EXPECTATIONS = ("call", "none")


def whose(sub_kind: str | None) -> str:
    """Whose a non-response is, in words: a serving failure, or the model's or harness's doing."""
    owner = NON_RESPONSE_OWNER.get(sub_kind or "", UNKNOWN)
    if owner == SERVING:
        return "a serving failure"
    if owner == UNKNOWN:
        return "nothing in the record says whose"
    return f"the {owner}'s doing, not a serving failure"
