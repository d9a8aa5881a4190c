"""A request body of any family <-> the shared Request, and the reply writer for a family."""

from __future__ import annotations

from typing import Any

import toolproxy.wire.chat as chat
import toolproxy.wire.gemini as gemini
import toolproxy.wire.messages as messages
import toolproxy.wire.responses as responses

from .endpoints import GEMINI, MESSAGES, OLLAMA_CHAT, OLLAMA_GENERATE, RESPONSES, streams
from .gemini import GeminiEncoder
from .messages import MessagesEncoder
from .model import Request
from .ollama import OllamaChatEncoder
from .responses import ResponsesEncoder

_READ = {RESPONSES: responses.read_request, MESSAGES: messages.read_request}
_WRITE = {RESPONSES: responses.write_request, MESSAGES: messages.write_request, GEMINI: gemini.write_request}


def read_request(family: str | None, body: dict[str, Any], path: str = "") -> Request:
    """The request in chat terms (messages, chat-shaped tools and tool choice). `path`: where it
    was sent, which Gemini names the model and the streaming mode in."""
    if family == GEMINI:
        return gemini.read_request(body, path)
    request = _READ.get(family, chat.read_request)(body)
    if family in (OLLAMA_CHAT, OLLAMA_GENERATE):
        request.family = family
        request.stream = streams(family, body)
    return request


def write_request(family: str, request: Request) -> dict[str, Any]:
    """A body of the given family carrying the request."""
    return _WRITE.get(family, chat.write_request)(request)


def encoder_for(family: str | None, body: dict[str, Any], stream: bool, query: str = "", model: str | None = None):
    """The reply writer for the family and streaming mode the client asked in (`query`: the
    request's query string, where Gemini asks for SSE with `alt=sse`; `model`: the model the
    reply names, when the body does not say it: Gemini's path does)."""
    if model is None:
        model = body.get("model") if isinstance(body.get("model"), str) else ""
    if family == GEMINI:
        return GeminiEncoder(model=model, stream=stream, sse="alt=sse" in query.split("&"))
    if family == OLLAMA_CHAT:
        return OllamaChatEncoder(model=model, stream=stream)
    if family == RESPONSES:
        return ResponsesEncoder(model=model, stream=stream)
    if family == MESSAGES:
        return MessagesEncoder(model=model, stream=stream)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return chat.ChatEncoder(model=model, stream=stream, include_usage=include_usage)


def tool_names(tools: Any) -> list[str]:
    """The names of a `tools` array in any family's shape (chat/Ollama `function`, Responses
    flat, Messages `name` + `input_schema`); entries without a string name are skipped."""
    out = []
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict):
            spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            if isinstance(spec.get("name"), str):
                out.append(spec["name"])
    return out


def stop_strings(body: Any) -> list[str]:
    """The stop strings a request asked for, in any family's field: `stop` (chat, completions,
    llama.cpp, and llama-server's Responses), `stop_sequences` (Messages), `options.stop` (Ollama).
    A harness may send one string or a list; anything else is not a stop string."""
    if not isinstance(body, dict):
        return []
    options = body.get("options")
    found = [body.get("stop"), body.get("stop_sequences"), options.get("stop") if isinstance(options, dict) else None]
    out: list[str] = []
    for value in found:
        for s in [value] if isinstance(value, str) else value if isinstance(value, list) else ():
            if isinstance(s, str) and s and s not in out:
                out.append(s)
    return out
