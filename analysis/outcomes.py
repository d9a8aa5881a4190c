"""The outcome vocabulary (SPEC section 5), shared by the classifier that assigns it and the
reports that count it; kept apart from classify so a report does not load the call validators."""

NON_RESPONSE = "non_response"
HALLUCINATED = "hallucinated_call"
INVALID_ARGS = "invalid_args"
VALID_CALL = "valid_call"
UNPARSEABLE = "unparseable"
PROSE = "prose"
# In the order classification decides them.
OUTCOMES = (NON_RESPONSE, HALLUCINATED, INVALID_ARGS, VALID_CALL, UNPARSEABLE, PROSE)
SUB_KINDS = ("refused", "http_4xx", "http_5xx", "timeout", "connect", "empty", "truncated", "retry_exhausted")
