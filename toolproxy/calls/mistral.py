"""Mistral's `[TOOL_CALLS]` marker: a JSON list of calls (v0.3 tokenizer and older, also Mistral
Nemo with an "id" per call) or, from tokenizer v11 on, `[TOOL_CALLS]name[ARGS]{...}` once per call.
When special tokens are skipped in decoding `[ARGS]` vanishes and the text reads
`[TOOL_CALLS]name{...}` (vLLM's tests show both); `[CALL_ID]id` may sit between name and args."""

from __future__ import annotations

import re

from .jsontext import JSONFault, Reader, broken_call, decode, skip_ws
from .model import Group, TextCall
from .scan import each_marker

MARKER = "[TOOL_CALLS]"
MARKERS = {"mistral": (MARKER,)}
_NAME = re.compile(r"([A-Za-z_][\w.\-]{0,199})(?:\[CALL_ID\][\w\-]{0,64})?(?:\[ARGS\])?")


def find_mistral(text: str, tool_names) -> list[Group]:
    return each_marker(
        text, MARKER, lambda start, body, limit: _one(text, start, skip_ws(text, body), limit, tool_names)
    )


def _one(text: str, start: int, j: int, limit: int, tool_names) -> Group:
    if j < limit and text[j] in "[{":
        reader = Reader(text, "mistral", tool_names)
        try:
            calls, end = reader.calls_at(j)
        except JSONFault as fault:
            salvaged = reader.salvage_list(j)[0] if text[j] == "[" else []
            calls = salvaged or [broken_call(text, j, limit, "mistral", str(fault))]
            return Group((start, limit), tuple(calls))
        if calls:
            return Group((start, end), tuple(calls))
        return Group(
            (start, end),
            (TextCall(None, None, text[j:end], "mistral", (start, end), "JSON after [TOOL_CALLS] is not a call"),),
        )
    match = _NAME.match(text, j) if j < limit else None
    if match is None:
        return Group((start, j), (TextCall(None, None, "", "mistral", (start, j), "no call after [TOOL_CALLS]"),))
    name = match.group(1)
    k = skip_ws(text, match.end())
    if k >= limit or text[k] != "{":
        # `[TOOL_CALLS]name` cut short keeps its name; `[TOOL_CALLS] some words` names nothing.
        end = match.end()
        named = name if j == start + len(MARKER) else None
        return Group(
            (start, end), (TextCall(named, None, "", "mistral", (start, end), "no arguments after the tool name"),)
        )
    try:
        value, end = decode(text, k)
    except JSONFault as fault:
        return Group(
            (start, limit),
            (TextCall(name, None, text[k:limit].rstrip(), "mistral", (start, limit), f"not valid JSON: {fault}"),),
        )
    return Group((start, end), (TextCall(name, value, text[k:end], "mistral", (start, end)),))
