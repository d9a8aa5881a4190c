"""The wire: one model of requests and replies, and per protocol family a reader and a writer.

Families (toolproxy.wire.endpoints): chat completions, text completions (with llama.cpp's
`/completion`), OpenAI Responses, Anthropic Messages, Ollama `/api/chat` and `/api/generate`,
Google Gemini (`:generateContent`, `:streamGenerateContent`).
Everyone who reads or writes the wire uses this package: the conditions live, the analyzer
afterwards, doctor and conformance, and the emulated stacks, so they cannot disagree about what a
reply said.
"""

from .decode import Decoder, decode
from .endpoints import (
    CHAT,
    COMPLETION,
    FAMILIES,
    GEMINI,
    MESSAGES,
    OLLAMA_CHAT,
    OLLAMA_GENERATE,
    RESPONSES,
    family_of,
    streams,
)
from .errors import error_of, error_text
from .model import (
    Call,
    CallArguments,
    CallEnd,
    CallStart,
    Error,
    Event,
    Finish,
    Reasoning,
    Reply,
    Request,
    Text,
    Usage,
    text_of,
)
from .requests import encoder_for, read_request, stop_strings, tool_names, write_request

__all__ = [
    "CHAT",
    "COMPLETION",
    "FAMILIES",
    "GEMINI",
    "MESSAGES",
    "OLLAMA_CHAT",
    "OLLAMA_GENERATE",
    "RESPONSES",
    "Call",
    "CallArguments",
    "CallEnd",
    "CallStart",
    "Decoder",
    "Error",
    "Event",
    "Finish",
    "Reasoning",
    "Reply",
    "Request",
    "Text",
    "Usage",
    "decode",
    "encoder_for",
    "error_of",
    "error_text",
    "family_of",
    "read_request",
    "stop_strings",
    "streams",
    "text_of",
    "tool_names",
    "write_request",
]
