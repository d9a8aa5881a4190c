"""JSON pieces shared by the families that carry JSON: decoding a value in place, deciding
whether a decoded object is a call, and reading call arguments (parse_arguments).

Decoding walks objects member by member with the stdlib's C scanner so that every argument value
keeps its exact source slice (`raw_arguments`) without a second pass. Strict JSON on purpose: a
literal newline inside a string or a NaN is what Python harnesses, vLLM and llama.cpp reject, so
it must count as unparseable here too.

Call-object aliases accepted (each seen in real output or a stack's parser):
  name:      "name" (OpenAI/Hermes/Llama), "tool_name" (Command-R, llama.cpp test-chat), and
             "function" / "tool" when their value is a string (hand-rolled agent prompts)
  arguments: "arguments" (Hermes, Mistral, LM Studio), "parameters" (Llama 3.x, Command-R;
             Ollama accepts both), "args" (hand-rolled prompts)
  wrappers:  {"function": {"name", "arguments"}} (an OpenAI tool_call leaked as text, optional
             "type"/"id"), {"tool_calls": [...]} (xLAM, Ollama's parser tests)
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Any

from .model import TextCall

NAME_KEYS = ("name", "tool_name", "function", "tool")
ARGS_KEYS = ("arguments", "parameters", "args")
_BARE_KEYS = frozenset({"type", "id"})

_WS = re.compile(r"[ \t\n\r]*")
# A bounded look for a name in JSON that does not decode: linear, no nested quantifiers.
_NAME_IN_BROKEN = re.compile(r'"(?:name|tool_name|function|tool)"\s*:\s*"((?:[^"\\\n]|\\.){1,200})"')
_ARGS_KEY = re.compile(r'"(?:arguments|parameters|args)"\s*:')


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


DECODER = json.JSONDecoder(parse_constant=_reject_constant)


class JSONFault(Exception):
    """The JSON at a position does not decode; `pos` is where decoding stopped."""

    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


def skip_ws(text: str, i: int) -> int:
    # Most calls land on a non-blank character: answer those without running the regex.
    return _WS.match(text, i).end() if text[i : i + 1] in " \t\n\r" else i


def decode(text: str, i: int) -> tuple[Any, int]:
    """The JSON value starting exactly at i and the index after it; JSONFault otherwise."""
    try:
        return DECODER.raw_decode(text, i)
    except json.JSONDecodeError as exc:
        raise JSONFault(exc.msg, exc.pos) from None
    except RecursionError:
        raise JSONFault("nested too deeply", len(text)) from None
    except ValueError as exc:
        raise JSONFault(str(exc), i) from None


@dataclass(frozen=True, slots=True)
class Member:
    value: Any
    start: int
    end: int


def members(text: str, i: int) -> tuple[dict[str, Member], int]:
    """The top-level members of the object at text[i] == '{', each with its value's source span."""
    out: dict[str, Member] = {}
    j = skip_ws(text, i + 1)
    if text.startswith("}", j):
        return out, j + 1
    while True:
        if not text.startswith('"', j):
            raise JSONFault("expecting property name enclosed in double quotes", j)
        try:
            key, j = scanstring(text, j + 1, True)
        except (json.JSONDecodeError, ValueError) as exc:
            raise JSONFault(getattr(exc, "msg", str(exc)), getattr(exc, "pos", j)) from None
        j = skip_ws(text, j)
        if not text.startswith(":", j):
            raise JSONFault("expecting ':' delimiter", j)
        start = skip_ws(text, j + 1)
        value, end = decode(text, start)
        out.setdefault(key, Member(value, start, end))
        j, done = _next_item(text, end, "}")
        if done:
            return out, j


def elements(text: str, i: int) -> tuple[list[tuple[int, int]], int]:
    """Spans of the elements of the array at text[i] == '['."""
    spans: list[tuple[int, int]] = []
    j = skip_ws(text, i + 1)
    if text.startswith("]", j):
        return spans, j + 1
    while True:
        _, end = decode(text, j)
        spans.append((j, end))
        j, done = _next_item(text, end, "]")
        if done:
            return spans, j


def _next_item(text: str, end: int, closer: str) -> tuple[int, bool]:
    """After a member or element: (start of the next one, False) or (index after closer, True)."""
    j = skip_ws(text, end)
    if text.startswith(",", j):
        return skip_ws(text, j + 1), False
    if text.startswith(closer, j):
        return j + 1, True
    raise JSONFault("expecting ',' delimiter", j)


def broken_call(text: str, start: int, end: int, fmt: str, why: str) -> TextCall:
    """An attempt whose JSON did not decode: keep whatever name is legible."""
    body = text[start:end]
    match = _NAME_IN_BROKEN.search(body)
    name = _unescape(match.group(1)) if match else None
    raw = ""
    args = _ARGS_KEY.search(body)
    if args:
        raw = body[args.end() :].strip()
    return TextCall(name, None, raw, fmt, (start, end), f"not valid JSON: {why}")


def looks_like_call(text: str, start: int, end: int) -> bool:
    """Broken JSON that names a tool and passes arguments: an attempt, not a stray brace."""
    body = text[start:end]
    return bool(_NAME_IN_BROKEN.search(body) and _ARGS_KEY.search(body))


def _unescape(s: str) -> str:
    try:
        return json.loads(f'"{s}"')
    except ValueError:
        return s


@dataclass(slots=True)
class Reader:
    """Turns the JSON at a position into calls, for one format and one request's tool names."""

    text: str
    fmt: str
    tool_names: Collection[str] | None = None
    # Fenced blocks: an object with a name but no arguments key is still a call, its other
    # members being the arguments (Qwen2.5-Coder writes {"name": "get_weather", "city": ...}).
    flatten: bool = False

    def calls_at(self, i: int) -> tuple[list[TextCall] | None, int]:
        """(calls, end) for the value at i; calls is None when the value is valid JSON but not a
        call or a list of calls. JSONFault when it does not decode at all."""
        text = self.text
        if text.startswith("{", i):
            calls, end = self.object_calls(i)
            return (calls or None), end
        if not text.startswith("[", i):
            _, end = decode(text, i)
            return None, end
        spans, end = elements(text, i)
        found: list[TextCall] = []
        for s, _ in spans:
            calls = self.object_calls(s)[0] if text.startswith("{", s) else []
            if not calls:
                return None, end
            found.extend(calls)
        return (found or None), end

    def salvage_list(self, i: int) -> tuple[list[TextCall], int]:
        """Calls from a '[' list that does not decode as a whole: the good leading elements, then
        one broken call for the element that failed (Ollama's parser recovers the same way)."""
        text = self.text
        found: list[TextCall] = []
        j = skip_ws(text, i + 1)
        while text.startswith("{", j):
            try:
                calls, end = self.object_calls(j)
            except JSONFault as fault:
                if found or looks_like_call(text, j, len(text)):
                    stop = max(fault.pos, j + 1)
                    found.append(broken_call(text, j, stop, self.fmt, str(fault)))
                    return found, stop
                return found, j
            if not calls:
                return found, j
            found.extend(calls)
            j = skip_ws(text, end)
            if not text.startswith(",", j):
                break
            j = skip_ws(text, j + 1)
        if text.startswith("]", j):
            j += 1
        return found, j

    def object_calls(self, i: int) -> tuple[list[TextCall], int]:
        """Calls in the object at text[i] == '{' (none if it is not a call) and the end of it."""
        text = self.text
        found, end = members(text, i)
        wrapped = found.get("tool_calls")
        if wrapped is not None and text.startswith("[", wrapped.start):
            calls, _ = self.calls_at(wrapped.start)
            return (calls or []), end
        nested = found.get("function")
        if nested is not None and text.startswith("{", nested.start):
            inner, _ = self.object_calls(nested.start)
            return [respan(c, i, end) for c in inner], end
        name_key = next((k for k in NAME_KEYS if k in found and isinstance(found[k].value, str)), None)
        if name_key is None:
            return [], end
        name = found[name_key].value
        args_key = next((k for k in ARGS_KEYS if k in found), None)
        fmt = "llama_json" if self.fmt == "bare_json" and args_key == "parameters" else self.fmt
        if args_key is not None and _is_definition(found, found[args_key].value):
            return [], end
        if args_key is not None:
            arg = found[args_key]
            value, error = _arguments_value(arg.value)
            return [TextCall(name, value, text[arg.start : arg.end], fmt, (i, end), error)], end
        known = self.tool_names is not None and name in self.tool_names
        rest = {k: m.value for k, m in found.items() if k != name_key and k not in _BARE_KEYS}
        if self.flatten or (known and not rest):
            return [TextCall(name, rest, "", fmt, (i, end))], end
        return [], end


def _is_definition(found: dict[str, Member], arguments: Any) -> bool:
    """A tool *definition* echoed back (Qwen's template lists tools in <tools> as
    {"type": "function", "function": {"name", "description", "parameters": schema}}) is not a call."""
    return (
        "description" in found
        and isinstance(arguments, dict)
        and ("properties" in arguments or arguments.get("type") == "object")
    )


def respan(call: TextCall, start: int, end: int) -> TextCall:
    """The call with another span (dataclasses.replace costs several times more, for every call)."""
    return TextCall(call.name, call.arguments, call.raw_arguments, call.format, (start, end), call.error)


def _arguments_value(value: Any) -> tuple[Any, str | None]:
    """Arguments given as a JSON string (Granite, some Qwen fine-tunes) are decoded once."""
    return parse_arguments(value) if isinstance(value, str) else (value, None)


def parse_arguments(raw: str | bytes | dict | list | None) -> tuple[Any, str | None]:
    """(value, error) for arguments as they reach the analyzer: a JSON string (OpenAI
    `function.arguments`), an object (Ollama native, some llama.cpp builds) or nothing. Strict
    JSON, like the harnesses that will json.loads it: NaN, Infinity, raw control characters in
    strings and trailing text are errors. None, "" and whitespace mean no arguments and give {}
    (llama.cpp sends "" for a call without parameters)."""
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
