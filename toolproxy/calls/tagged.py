"""Calls wrapped in tags: Hermes-style `<tool_call>` JSON (Hermes 2 Pro, Qwen2.5, Qwen3), the LM
Studio default `[TOOL_REQUEST]...[END_TOOL_REQUEST]`, and Qwen3-Coder's XML
`<function=f><parameter=p>v</parameter></function>`.

Strong tags (`<tool_call>`, `<TOOLCALL>`, `[TOOL_REQUEST]`, `<function=`) are an attempt whatever
follows them. The looser wrappers llama.cpp's Hermes 2 Pro parser also accepts (`<tool>`, `<tools>`,
`<function_call>`, `<json>`, `<xml>`, `<response>`) appear in prose and prompts too, so they
only count when they hold a call with a legible name.
A missing closing tag is common (generation stopped at EOS): the call then ends where its JSON or
XML ends, or where the next opening tag starts.
"""

from __future__ import annotations

import re

from .jsontext import DECODER, JSONFault, Reader, broken_call, skip_ws
from .model import Group, TextCall
from .scan import each_marker

_HERMES_OPEN = re.compile(r"<(tool_call|TOOLCALL|tools?|function_call|json|JSON|xml|response)>")
_STRONG = {"tool_call", "TOOLCALL"}
_LMSTUDIO_OPEN = "[TOOL_REQUEST]"
_LMSTUDIO_CLOSE = "[END_TOOL_REQUEST]"

_FUNCTION_OPEN = re.compile(r'<function(?:=([^>\n]{1,200})|\s+name="([^"\n]{1,200})"\s*)>')
_FUNCTION_START = re.compile(r"<function[= ]")
_PARAMETER_OPEN = re.compile(r"<parameter=([^>\n]{1,200})>")
_FUNCTION_CLOSE = "</function>"
_PARAMETER_CLOSE = "</parameter>"

# Where each format's call syntax can begin (every opening the finders below accept), so a
# streaming reader knows from which point text may be a call.
MARKERS = {
    "hermes": tuple(
        f"<{tag}>"
        for tag in ("tool_call", "TOOLCALL", "tool", "tools", "function_call", "json", "JSON", "xml", "response")
    ),
    "lmstudio": (_LMSTUDIO_OPEN,),
    "qwen_xml": ("<tool_call>", _LMSTUDIO_OPEN, "<function=", "<function "),
}


def find_hermes(text: str, tool_names) -> list[Group]:
    groups: list[Group] = []
    pos = 0
    while True:
        match = _HERMES_OPEN.search(text, pos)
        if match is None:
            return groups
        tag = match.group(1)
        close = f"</{tag}>"
        nxt = _HERMES_OPEN.search(text, match.end())
        limit = _limit(text, match.end(), close, nxt.start() if nxt else len(text))
        group = _wrapped(text, match.start(), match.end(), limit, close, "hermes", tool_names)
        if group is not None and (tag in _STRONG or any(c.name is not None for c in group.calls)):
            groups.append(group)
            pos = group.span[1]
        else:
            pos = match.end()


def find_lmstudio(text: str, tool_names) -> list[Group]:
    def read(start: int, body: int, next_open: int) -> Group:
        limit = _limit(text, body, _LMSTUDIO_CLOSE, next_open)
        return _wrapped(text, start, body, limit, _LMSTUDIO_CLOSE, "lmstudio", tool_names)

    return each_marker(text, _LMSTUDIO_OPEN, read)


def find_qwen_xml(text: str, tool_names) -> list[Group]:
    """`<function=...>` outside any `<tool_call>` (vLLM's qwen3_coder parser accepts it bare)."""
    groups: list[Group] = []
    pos = 0
    while (match := _FUNCTION_START.search(text, pos)) is not None:
        calls, end = _functions(text, match.start(), len(text))
        groups.append(Group((match.start(), end), tuple(calls)))
        pos = max(end, match.end())
    return groups


def _limit(text: str, body: int, close: str, next_open: int) -> int:
    """Where a tag's body ends: its closing tag, else the next opening tag, else the text's end."""
    found = text.find(close, body, next_open)
    return found if found >= 0 else next_open


def _wrapped(text: str, start: int, body: int, limit: int, close: str, fmt: str, tool_names) -> Group | None:
    closed = text.startswith(close, limit)
    end_tag = limit + len(close) if closed else limit
    j = skip_ws(text, body)
    if j >= limit:
        return Group((start, end_tag), (TextCall(None, None, "", fmt, (start, end_tag), "empty call tag"),))
    if _FUNCTION_START.match(text, j):
        calls, end = _functions(text, j, limit)
        return Group((start, end_tag if closed else end), tuple(calls))
    raw = text[j:limit].rstrip()
    if text[j] not in "[{":
        return Group((start, end_tag), (TextCall(None, None, raw, fmt, (start, end_tag), "call tag holds no JSON"),))
    reader = Reader(text, fmt, tool_names)
    try:
        calls, end = reader.calls_at(j)
    except JSONFault as fault:
        salvaged: list[TextCall] = []
        if text[j] == "[":
            salvaged, _ = reader.salvage_list(j)
        calls = salvaged or [broken_call(text, j, limit, fmt, str(fault))]
        return Group((start, end_tag), tuple(calls))
    if not calls:
        return Group(
            (start, end_tag), (TextCall(None, None, raw, fmt, (start, end_tag), "JSON in call tag is not a call"),)
        )
    return Group((start, end_tag if closed else end), tuple(calls))


def _functions(text: str, start: int, limit: int) -> tuple[list[TextCall], int]:
    """Consecutive `<function=...>` blocks from start; a block without `</function>` runs to limit."""
    calls: list[TextCall] = []
    pos = start
    while True:
        j = skip_ws(text, pos)
        match = _FUNCTION_OPEN.match(text, j) if j < limit else None
        if match is None:
            if not calls:
                stop = text.find(">", start, limit)
                end = stop + 1 if stop >= 0 else limit
                calls.append(TextCall(None, None, "", "qwen_xml", (start, end), "unreadable <function=...> tag"))
                return calls, end
            return calls, pos
        name = (match.group(1) or match.group(2)).strip()
        close = text.find(_FUNCTION_CLOSE, match.end(), limit)
        body_end = close if close >= 0 else limit
        end = close + len(_FUNCTION_CLOSE) if close >= 0 else limit
        raw = text[match.end() : body_end]
        arguments, error = _function_arguments(text, match.end(), body_end)
        calls.append(TextCall(name, arguments, raw.strip(), "qwen_xml", (j, end), error))
        pos = end
        if close < 0:
            return calls, end


def _function_arguments(text: str, start: int, end: int) -> tuple[object, str | None]:
    j = skip_ws(text, start)
    if j < end and text[j] == "{":
        try:
            value, stop = DECODER.raw_decode(text, j)
        except (ValueError, RecursionError) as exc:
            return None, f"not valid JSON: {exc}"
        if skip_ws(text, stop) != end:
            return None, "text after the JSON arguments"
        return value, None
    arguments: dict[str, object] = {}
    match = _PARAMETER_OPEN.search(text, start, end)
    while match is not None:
        following = _PARAMETER_OPEN.search(text, match.end(), end)
        bound = following.start() if following is not None else end
        close = text.find(_PARAMETER_CLOSE, match.end(), bound)
        stop = close if close >= 0 else bound
        arguments.setdefault(match.group(1).strip(), _parameter_value(text[match.end() : stop]))
        match = following
    return arguments, None


def _parameter_value(raw: str) -> object:
    """Qwen3-Coder writes every value as raw text between newlines. Values that are JSON (numbers,
    booleans, objects, arrays) are decoded; everything else stays a string. Without the tool's
    schema a numeric-looking string parameter becomes a number: vLLM and llama.cpp convert by
    schema instead, so such a call can validate differently there."""
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    try:
        return DECODER.decode(value.strip())
    except (ValueError, RecursionError):
        return value
