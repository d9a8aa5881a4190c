"""FunctionGemma (Gemma 3 270M fine-tune): `<start_function_call>call:f{k:<escape>v<escape>,n:3}
<end_function_call>`, and the Gemma 4 spelling `<|tool_call>call:f{...}<tool_call|>` whose strings
are delimited by `<|"|>` (or written as JSON strings). Keys are bare words, strings sit between
delimiters, numbers/booleans are bare, objects and lists nest. The end marker may be missing."""

from __future__ import annotations

import re

from .jsontext import DECODER, JSONFault, decode, skip_ws
from .model import Group, TextCall

_OPEN = re.compile(r"<start_function_call>|<\|tool_call>")
_CLOSES = {"<start_function_call>": "<end_function_call>", "<|tool_call>": "<tool_call|>"}
_CALL = re.compile(r"\s*call:\s*([A-Za-z_][\w.\-]{0,199})\s*")
_DELIMS = ("<escape>", '<|"|>')
_KEY = re.compile(r'\s*(?:"((?:[^"\\\n]|\\.){1,200})"|([^:,{}\[\]\s"]{1,200}))\s*:')
_SCALAR = re.compile(r"[^,}\]]*")
_MAX_DEPTH = 64

MARKERS = {"functiongemma": tuple(_CLOSES)}


def find_functiongemma(text: str, tool_names) -> list[Group]:
    groups: list[Group] = []
    pos = 0
    while (match := _OPEN.search(text, pos)) is not None:
        close = _CLOSES[match.group(0)]
        nxt = _OPEN.search(text, match.end())
        limit = nxt.start() if nxt else len(text)
        found = text.find(close, match.end(), limit)
        body_end = found if found >= 0 else limit
        group = _one(text, match.start(), match.end(), body_end)
        if found >= 0:
            group = Group(
                (group.span[0], found + len(close)), tuple(_respan(c, found + len(close)) for c in group.calls)
            )
        groups.append(group)
        pos = max(group.span[1], match.end())
    return groups


def _respan(call: TextCall, end: int) -> TextCall:
    return TextCall(call.name, call.arguments, call.raw_arguments, call.format, (call.span[0], end), call.error)


def _one(text: str, start: int, body: int, limit: int) -> Group:
    match = _CALL.match(text, body, limit)
    if match is None:
        raw = text[body:limit].strip()
        return Group(
            (start, limit),
            (TextCall(None, None, raw, "functiongemma", (start, limit), "no call:NAME after the call marker"),),
        )
    name = match.group(1)
    j = match.end()
    if j >= limit or text[j] != "{":
        return Group(
            (start, limit),
            (
                TextCall(
                    name, None, text[j:limit].strip(), "functiongemma", (start, limit), "no {arguments} after the name"
                ),
            ),
        )
    try:
        value, end = _Parser(text, limit).value(j, 0)
    except JSONFault as fault:
        raw = text[j:limit].strip()
        return Group(
            (start, limit),
            (TextCall(name, None, raw, "functiongemma", (start, limit), f"unreadable arguments: {fault}"),),
        )
    return Group((start, end), (TextCall(name, value, text[j:end], "functiongemma", (start, end)),))


class _Parser:
    def __init__(self, text: str, limit: int):
        self.text = text
        self.limit = limit

    def value(self, i: int, depth: int) -> tuple[object, int]:
        if depth > _MAX_DEPTH:
            raise JSONFault("nested too deeply", i)
        text = self.text
        i = skip_ws(text, i)
        if i >= self.limit:
            raise JSONFault("arguments end early", i)
        if text[i] == "{":
            return self._object(i, depth)
        if text[i] == "[":
            return self._list(i, depth)
        for delim in _DELIMS:
            if text.startswith(delim, i):
                stop = text.find(delim, i + len(delim), self.limit)
                if stop < 0:
                    raise JSONFault(f"unterminated {delim} string", i)
                return text[i + len(delim) : stop], stop + len(delim)
        if text[i] == '"':
            return decode(text, i)
        token = _SCALAR.match(text, i, self.limit)
        raw = token.group(0).strip()
        if not raw:
            raise JSONFault("missing value", i)
        try:
            return DECODER.decode(raw), token.end()
        except (ValueError, RecursionError):
            return raw, token.end()

    def _object(self, i: int, depth: int) -> tuple[dict, int]:
        text = self.text
        out: dict[str, object] = {}
        j = skip_ws(text, i + 1)
        if text.startswith("}", j):
            return out, j + 1
        while True:
            key = _KEY.match(text, j, self.limit)
            if key is None:
                raise JSONFault("expecting key:", j)
            value, j = self.value(key.end(), depth + 1)
            out.setdefault(key.group(1) or key.group(2), value)
            j = skip_ws(text, j)
            if text.startswith(",", j):
                j = skip_ws(text, j + 1)
                if text.startswith("}", j):
                    return out, j + 1
            elif text.startswith("}", j):
                return out, j + 1
            else:
                raise JSONFault("expecting ',' or '}'", j)

    def _list(self, i: int, depth: int) -> tuple[list, int]:
        text = self.text
        out: list[object] = []
        j = skip_ws(text, i + 1)
        if text.startswith("]", j):
            return out, j + 1
        while True:
            value, j = self.value(j, depth + 1)
            out.append(value)
            j = skip_ws(text, j)
            if text.startswith(",", j):
                j += 1
            elif text.startswith("]", j):
                return out, j + 1
            else:
                raise JSONFault("expecting ',' or ']'", j)
