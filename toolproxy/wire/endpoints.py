"""Which protocol family a request path speaks, and what each family streams by default."""

from __future__ import annotations

CHAT = "chat"
COMPLETION = "completion"
RESPONSES = "responses"
MESSAGES = "messages"
OLLAMA_CHAT = "ollama_chat"
OLLAMA_GENERATE = "ollama_generate"
GEMINI = "gemini"

FAMILIES = (CHAT, COMPLETION, RESPONSES, MESSAGES, OLLAMA_CHAT, OLLAMA_GENERATE, GEMINI)

# (path suffix, family), most specific first: `/completions` must not swallow `/chat/completions`.
# Gemini names the model and the method in the last segment (`models/m:streamGenerateContent`);
# its `:countTokens` asks no model for a completion, like Messages' `/count_tokens`.
_SUFFIXES = (
    (":generateContent", GEMINI),
    (":streamGenerateContent", GEMINI),
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
# Gemini streams without alt=sse as one JSON array of replies.
ARRAY_FRAMED = frozenset({GEMINI})


def family_of(path: str) -> str | None:
    """The family a request path belongs to; None for anything that is not a model call."""
    p = path.split("?", 1)[0].rstrip("/")
    for suffix, family in _SUFFIXES:
        if p.endswith(suffix):
            return family
    return None


def streams(family: str | None, body: dict, path: str = "") -> bool:
    """Whether a request of this family asks for a streamed reply (Gemini says so in its path)."""
    if family == GEMINI:
        return path.split("?", 1)[0].rstrip("/").endswith(":streamGenerateContent")
    return bool(body.get("stream", family in STREAMS_BY_DEFAULT))
