"""Which protocol family a request path speaks, and what each family streams by default."""

from __future__ import annotations

CHAT = "chat"
COMPLETION = "completion"
RESPONSES = "responses"
MESSAGES = "messages"
OLLAMA_CHAT = "ollama_chat"
OLLAMA_GENERATE = "ollama_generate"

FAMILIES = (CHAT, COMPLETION, RESPONSES, MESSAGES, OLLAMA_CHAT, OLLAMA_GENERATE)

# (path suffix, family), most specific first: `/completions` must not swallow `/chat/completions`.
_SUFFIXES = (
    ("/chat/completions", CHAT),
    ("/responses", RESPONSES),
    ("/v1/messages", MESSAGES),  # not OpenAI's /v1/threads/{id}/messages
    ("/api/chat", OLLAMA_CHAT),
    ("/api/generate", OLLAMA_GENERATE),
    ("/completions", COMPLETION),
    ("/completion", COMPLETION),
)
# Ollama's native API streams unless the request says `"stream": false`; the others only when asked.
STREAMS_BY_DEFAULT = frozenset({OLLAMA_CHAT, OLLAMA_GENERATE})
LINE_FRAMED = STREAMS_BY_DEFAULT


def family_of(path: str) -> str | None:
    """The family a request path belongs to; None for anything that is not a model call."""
    p = path.split("?", 1)[0].rstrip("/")
    for suffix, family in _SUFFIXES:
        if p.endswith(suffix):
            return family
    return None


def streams(family: str | None, body: dict) -> bool:
    """Whether a request of this family asks for a streamed reply."""
    return bool(body.get("stream", family in STREAMS_BY_DEFAULT))
