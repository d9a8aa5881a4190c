"""How servers write JSON and streams: each language's JSON encoder's habits, SSE framing, token-sized pieces."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any

import orjson


def compact(obj: Any) -> bytes:
    """Python servers (FastAPI/starlette, pydantic) and nlohmann::json: no spaces, UTF-8 as is."""
    return orjson.dumps(obj)


def go_json(obj: Any) -> bytes:
    """Go's encoding/json: compact and HTML-safe (<, >, & escaped), as Ollama writes it."""
    return (
        orjson.dumps(obj)
        .replace(b"<", b"\\u003c")
        .replace(b">", b"\\u003e")
        .replace(b"&", b"\\u0026")
        .replace("\u2028".encode(), b"\\u2028")
        .replace("\u2029".encode(), b"\\u2029")
    )


def go_numbers(value: Any) -> Any:
    """Ollama decodes arguments into Go values and re-marshals them: 3.0 comes back as 3."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: go_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [go_numbers(v) for v in value]
    return value


def go_encoder(obj: Any) -> bytes:
    """Go's json.NewEncoder(w).Encode: go_json plus a newline."""
    return go_json(obj) + b"\n"


def pretty_json(obj: Any) -> bytes:
    """api.openai.com and LM Studio pretty-print non-streamed bodies (2-space indent)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2)


def sse(obj: Any, dumps: Callable[[Any], bytes] = compact) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def pieces(s: str) -> list[str]:
    """Split text into token-sized pieces (a word and its trailing space), as stacks stream it."""
    return re.findall(r"\S+\s*|\s+", s) or [""]


def fragments(s: str, n: int = 3) -> list[str]:
    """Argument JSON cut into n fragments, as OpenAI and vLLM stream it."""
    step = max(1, -(-len(s) // n))
    return [s[i : i + step] for i in range(0, len(s), step)] or [""]


def random_text(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
LOWER = "abcdefghijklmnopqrstuvwxyz0123456789"
