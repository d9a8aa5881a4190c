"""JSON calls with no marker around them: in a Markdown code fence (Qwen2.5-Coder on llama.cpp
and vLLM answers this way by default, sometimes naming a file path as the tool) and bare in prose
(Llama 3.x `{"name": ..., "parameters": ...}`, several separated by `;`; Qwen2.5-Coder on Ollama
`{"name": ..., "arguments": ...}`).

JSON that is valid but not a call object (`{"temperature": 20}`) is an answer, not an attempt.
Broken JSON is an attempt only when it visibly names a tool and passes arguments.

Linear-ish on hostile input: a decode that fails is charged the distance it read, and once the
charge passes a few times the text's length, or failures pile up past a few thousand, no further
bare candidates are decoded (only hostile or degenerate text gets there: ordinary replies hold a
handful of braces)."""

from __future__ import annotations

import re

from .jsontext import JSONFault, Reader, broken_call, looks_like_call, skip_ws
from .model import Group

_FENCE = re.compile(r"```[ \t]*([A-Za-z_][\w+\-]*)?[ \t]*\r?\n")
_FENCE_CLOSE = "```"
_JSON_LANGS = {None, "json", "json5", "jsonc", "tool_call", "tool_calls", "tool", "function_call", "javascript", "js"}
_CANDIDATE = re.compile(r'\{\s*"|\[\s*\{')

# Where each format's call can begin: a fence, or any brace or bracket (a bare call has no marker).
MARKERS = {"fenced_json": ("```",), "bare_json": ("{", "["), "llama_json": ("{", "[")}


def find_fenced(text: str, tool_names) -> list[Group]:
    groups: list[Group] = []
    pos = 0
    while (match := _FENCE.search(text, pos)) is not None:
        close = text.find(_FENCE_CLOSE, match.end())
        body_end = close if close >= 0 else len(text)
        end = close + len(_FENCE_CLOSE) if close >= 0 else len(text)
        lang = match.group(1).lower() if match.group(1) else None
        if lang in _JSON_LANGS:
            group = _fenced_body(text, match.start(), match.end(), body_end, end, tool_names)
            if group is not None:
                groups.append(group)
        pos = end
    return groups


def _fenced_body(text: str, start: int, body: int, body_end: int, end: int, tool_names) -> Group | None:
    j = skip_ws(text, body)
    if j >= body_end or text[j] not in "[{":
        return None
    reader = Reader(text, "fenced_json", tool_names, flatten=True)
    try:
        calls, _ = reader.calls_at(j)
    except JSONFault as fault:
        salvaged = reader.salvage_list(j)[0] if text[j] == "[" else []
        if salvaged:
            return Group((start, end), tuple(salvaged))
        if looks_like_call(text, j, body_end):
            return Group((start, end), (broken_call(text, j, body_end, "fenced_json", str(fault)),))
        return None
    return Group((start, end), tuple(calls)) if calls else None


def find_bare(text: str, tool_names, claimed=None) -> list[Group]:
    groups: list[Group] = []
    reader = Reader(text, "bare_json", tool_names)
    budget = 4 * len(text) + 1_000_000
    failures = 2_000 + len(text) // 1_000
    pos = 0
    while budget > 0 and failures > 0 and (match := _CANDIDATE.search(text, pos)) is not None:
        i = match.start()
        skip = claimed(i) if claimed else None
        if skip is not None:
            pos = skip
            continue
        try:
            calls, end = reader.calls_at(i)
        except JSONFault as fault:
            budget -= max(fault.pos - i, 1)
            group = _broken_bare(text, reader, i, fault)
            if group is not None:
                groups.append(group)
                pos = group.span[1]
            else:
                failures -= 1
                pos = i + 1
            continue
        if calls:
            groups.append(Group((i, end), tuple(calls)))
        pos = end
    return groups


def _broken_bare(text: str, reader: Reader, i: int, fault: JSONFault) -> Group | None:
    if text[i] == "[":
        salvaged, end = reader.salvage_list(i)
        return Group((i, end), tuple(salvaged)) if salvaged else None
    stop = min(max(fault.pos, i + 1), len(text))
    if not looks_like_call(text, i, stop + 1):
        return None
    line_end = text.find("\n", stop)
    end = len(text) if line_end < 0 else line_end
    return Group((i, end), (broken_call(text, i, end, "bare_json", str(fault)),))
