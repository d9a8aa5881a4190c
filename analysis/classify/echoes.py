"""Calls a harness wrote back into the conversation as text.

Some harnesses do not resend an earlier reply as it came: smolagents' ToolCallingAgent turns the
model's structured call into an assistant message "Calling tools:\\n[{...}]" (a Python repr) and
the tool result into a user "Observation:" message. Message-prefix chaining cannot see that such
a request continues the earlier one, because the resent assistant message differs from the
reply. What survives the rewrite is the call itself: its name and arguments, serialised as JSON,
as a Python literal, or in one of the model-side formats toolproxy already parses. Recovering
them lets episode reconstruction match the echo against the call the earlier reply made.

Input is model- and harness-written text, so everything here is bounded and never raises.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Sequence
from typing import Any

import orjson

from toolproxy.analysis.classify.textparse import parsed_text

# Longest text searched for an echo, and the most bracketed spans tried in it: an echo is a few
# hundred bytes; a huge assistant message is prose or code, not a call list.
MAX_TEXT = 64 * 1024
MAX_SPANS = 32
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")
_CLOSE = {"[": "]", "{": "}"}


def echoed_calls(text: str, tool_names: Sequence[str]) -> list[list[tuple[str, Any]]]:
    """The calls to offered tools serialised in `text`, as every reading that finds some: the
    model-side formats toolproxy parses, then JSON or Python literals anywhere in the text.

    Two readings because a harness may resend the model's own text beside its re-serialisation
    (smolagents on a stack that left a Hermes call in the text: "<tool_call>...</tool_call>
    Calling tools: [...]"), and then only one reading holds the calls once. Only offered names
    count, so prose that merely contains braces echoes nothing."""
    if not text or len(text) > MAX_TEXT or not any(n and n in text for n in tool_names):
        return []
    # The text is most often a reply classify parsed a turn earlier: parsed_text remembers it.
    offered = frozenset(tool_names)
    parsed = [
        (c.name, c.arguments) for c in parsed_text(text, tool_names).calls if c.error is None and c.name in offered
    ]
    literal: list[tuple[str, Any]] = []
    for value in _literals(text):
        _collect(value, offered, literal, 0)
    return [calls for i, calls in enumerate((parsed, literal)) if calls and (i == 0 or calls != parsed)]


def _literals(text: str):
    """Outermost bracketed spans of `text` that read as JSON or as a Python literal."""
    i = tried = 0
    while tried < MAX_SPANS:
        starts = [k for k in (text.find("[", i), text.find("{", i)) if k >= 0]
        if not starts:
            return
        start = min(starts)
        end = _matching(text, start)
        if end is None:
            return
        tried += 1
        value = _load(text[start:end])
        if value is not None:
            yield value
            i = end
        else:
            i = start + 1


def _matching(text: str, start: int) -> int | None:
    """Index after the bracket closing text[start], skipping quoted strings; None if unclosed."""
    stack = [_CLOSE[text[start]]]
    quote = None
    k = start + 1
    n = len(text)
    while k < n:
        ch = text[k]
        if quote:
            if ch == "\\":
                k += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in _CLOSE:
            stack.append(_CLOSE[ch])
        elif ch in "]}":
            if ch != stack.pop():
                return None
            if not stack:
                return k + 1
        k += 1
    return None


def _load(span: str) -> Any:
    try:
        return orjson.loads(span)
    except orjson.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(span)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return None


def _collect(value: Any, tool_names: Collection[str], out: list, depth: int) -> None:
    """Call-shaped dicts in `value`: {name, arguments|parameters|args|input}, or {function: {...}}."""
    if depth > 8:
        return
    if isinstance(value, list):
        for v in value:
            _collect(v, tool_names, out, depth + 1)
    elif isinstance(value, dict):
        fn = value.get("function")
        if isinstance(fn, dict):
            _collect(fn, tool_names, out, depth + 1)
            return
        name = value.get("name")
        if isinstance(name, str) and name in tool_names:
            out.append((name, next((value[k] for k in _ARGUMENT_KEYS if k in value), {})))
            return
        for v in value.values():
            _collect(v, tool_names, out, depth + 1)
