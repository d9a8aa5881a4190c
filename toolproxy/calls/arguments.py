"""Arguments as they reach the analyzer: a JSON string (OpenAI `function.arguments`), an object
(Ollama native, some llama.cpp builds) or nothing."""

from __future__ import annotations

from typing import Any

from .jsontext import DECODER


def parse_arguments(raw: str | bytes | dict | list | None) -> tuple[Any, str | None]:
    """(value, error). Strict JSON, like the harnesses that will json.loads it: NaN, Infinity,
    raw control characters in strings and trailing text are errors. None, "" and whitespace mean
    no arguments and give {} (llama.cpp sends "" for a call without parameters)."""
    if raw is None:
        return {}, None
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, f"arguments are not UTF-8: {exc}"
    if not isinstance(raw, str):
        return raw, None
    if not raw.strip():
        return {}, None
    try:
        return DECODER.decode(raw), None
    except RecursionError:
        return None, "arguments are not valid JSON: nested too deeply"
    except ValueError as exc:
        return None, f"arguments are not valid JSON: {exc}"
