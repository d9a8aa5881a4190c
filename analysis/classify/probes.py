"""Requests a harness sends to find out what the server supports, not to work on its task.

They ask the model something, so they are completion requests on the wire, but they are no
turn of any episode: counted as one, each would be an episode of its own (a `no_tools` turn
that opens and ends it) in every run the harness makes. Each probe is known by its exact shape,
as the harness's source writes it, so a task that happens to ask the same is never mistaken for
one. A recognised probe is recorded and stored like any exchange, but is not an attempt: it is
not grouped into turns or episodes, and the record says which probe it was.
"""

from __future__ import annotations

from typing import Any

from toolproxy.wire import RESPONSES

# (family, the body's fields that make it the probe, which harness sends it and why)
PROBES: tuple[tuple[str, dict[str, Any], str], ...] = (
    # inspect_ai/model/_providers/openai.py, OpenAIAPI.reasoning_summaries(): once per provider
    # instance, before the first Responses request, to learn whether the account may ask for
    # reasoning summaries.
    (
        RESPONSES,
        {"input": "Please say 'hello, world'", "reasoning": {"effort": "low", "summary": "auto"}},
        "inspect-ai's reasoning-summaries probe",
    ),
)
# A probe offers no tools, chains to nothing and asks for nothing else.
_OTHER_FIELDS = frozenset(("model", "stream", "store", "metadata", "user"))


PREWARM = "a prewarm (Responses' generate: false asks for no output; Codex sends one before a turn)"


def probe_of(family: str | None, body: Any) -> str | None:
    """Which known probe this request is, in words, or None for a request of the harness's task."""
    if not isinstance(body, dict):
        return None
    if family == RESPONSES and body.get("generate") is False:
        return PREWARM
    for probe_family, fields, what in PROBES:
        if (
            family == probe_family
            and all(body.get(k) == v for k, v in fields.items())
            and set(body) - set(fields) <= _OTHER_FIELDS
        ):
            return what
    return None
