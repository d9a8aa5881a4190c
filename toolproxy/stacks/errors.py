"""The human part of a stack's error body, whatever its shape.

Shapes seen: OpenAI/llama.cpp/vLLM `{"error": {"message": ...}}`, Ollama native `{"error": "..."}`,
older vLLM and SGLang flat `{"object": "error", "message": ...}`, FastAPI `{"detail": "..."}`, and
plain text or HTML from whatever sits in front.
"""

from __future__ import annotations

import orjson

_MAX = 1000


def error_text(body: bytes) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:_MAX]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, str):
            return err
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        for key in ("message", "detail"):
            if isinstance(data.get(key), str):
                return data[key]
    return body.decode("utf-8", "replace").strip()[:_MAX]
