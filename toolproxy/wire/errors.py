"""The error a stack reports, in any of the shapes stacks use, in a body or inside a stream.

Shapes: OpenAI / llama.cpp / vLLM `{"error": {"message": ...}}`, Ollama native `{"error": "..."}`,
older vLLM and SGLang flat `{"object": "error", "message": ...}`, FastAPI `{"detail": ...}`,
Anthropic `{"type": "error", "error": {"type", "message"}}`, Responses stream `{"type": "error",
"code", "message"}` and `response.failed` (`response.error`), and plain text or HTML from
whatever sits in front of the stack.
"""

from __future__ import annotations

from typing import Any

import orjson

_MAX = 1000


def _message(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message")
        return str(msg) if msg is not None else orjson.dumps(err).decode()
    return str(err)


def error_of(obj: Any) -> str | None:
    """The message of an error object, else None (a normal reply or chunk)."""
    if not isinstance(obj, dict):
        return None
    if "error" in obj:
        err = obj["error"]
        if err is not None and not obj.get("choices"):
            return _message(err)
    kind = obj.get("type")
    if kind == "error" and isinstance(obj.get("message"), str):
        return obj["message"]
    if kind == "response.failed" and isinstance(obj.get("response"), dict):
        return _message(obj["response"].get("error") or "response failed")
    if "object" in obj and obj["object"] == "error":
        return str(obj.get("message") or "")
    if "detail" in obj and len(obj) <= 2 and "choices" not in obj:
        detail = obj["detail"]
        return detail if isinstance(detail, str) else orjson.dumps(detail).decode()
    return None


def error_text(body: bytes) -> str:
    """The human part of an error body: the stack's message, or the body's own text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:_MAX]
    message = error_of(data)
    if message is None and isinstance(data, dict):
        message = next((data[k] for k in ("message", "detail") if isinstance(data.get(k), str)), None)
    return message if message is not None else body.decode("utf-8", "replace").strip()[:_MAX]
