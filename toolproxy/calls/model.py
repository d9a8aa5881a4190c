"""The plain data a text parse returns; shared by every format family and by both users."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FORMATS = (
    "hermes",
    "qwen_xml",
    "llama_json",
    "python_tag",
    "mistral",
    "pythonic",
    "functiongemma",
    "lmstudio",
    "fenced_json",
    "bare_json",
)


@dataclass(frozen=True, slots=True)
class TextCall:
    """One call found in text. `name` is None when a call was clearly attempted but no name could
    be recovered; `arguments` is None when the arguments could not be parsed (`error` says why)."""

    name: str | None
    arguments: Any
    raw_arguments: str
    format: str
    span: tuple[int, int]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TextParse:
    calls: tuple[TextCall, ...]
    attempted: bool
    content: str


@dataclass(frozen=True, slots=True)
class Group:
    """Call syntax claimed by one finder: the span removed from content and the calls inside it.

    A group without calls cannot exist: an attempt that recovered nothing is a call with name None."""

    span: tuple[int, int]
    calls: tuple[TextCall, ...]
