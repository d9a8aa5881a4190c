"""The outcome and role vocabulary (README: "Analysis", "Roles and metrics"), shared by the analyzer that assigns it
and the reports that count it; kept apart from classify so a report does not load the call validators."""

# The version of the rules that turn raw records into outcomes, roles and metrics. Every derived
# row records the version that produced it, and `toolproxy analyze` rebuilds every derived table
# from the stored raw bodies when the store was analysed under another version, so old and new
# rules are never mixed. The rule: bump it in the same commit as any change to classification
# (classify.py, the call parsers), to turns/episodes/roles (turns.py) or to what a metric counts.
ANALYZER_VERSION = 4

NON_RESPONSE = "non_response"
HALLUCINATED = "hallucinated_call"
INVALID_ARGS = "invalid_args"
VALID_CALL = "valid_call"
UNPARSEABLE = "unparseable"
PROSE = "prose"
# In the order classification decides them.
OUTCOMES = (NON_RESPONSE, HALLUCINATED, INVALID_ARGS, VALID_CALL, UNPARSEABLE, PROSE)
# Why nothing reached the harness. A turn the harness retried keeps its cause (the last attempt's);
# the number of attempts is kept beside it, so retries never hide a refusal.
SUB_KINDS = ("refused", "http_4xx", "http_5xx", "timeout", "connect", "swallowed", "empty", "truncated")

# What a produced turn was for (non-responses have no role: the model's output never arrived).
NO_TOOLS = "no_tools"
ANSWER = "answer"
ABSTAIN = "abstain"
CALL = "call"
OPEN = "open"
ROLES = (CALL, ANSWER, ABSTAIN, OPEN, NO_TOOLS)
# What an item expects, from its `expect` tag or an analyst's rule.
EXPECTATIONS = ("call", "none")
