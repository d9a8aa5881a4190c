"""Pythonic calls: `[f(a=1), g(b='x')]` (Llama 3.2/4 pythonic, vLLM's `pythonic` parser), also
inside `<function_calls>...</function_calls>` or `<|python_start|>...<|python_end|>`, and
`<|python_tag|>` followed by Llama 3.1 JSON calls (`;`-separated) or a built-in tool call
`brave_search.call(query="...")`.

Parsed with `ast` and `ast.literal_eval` on each argument: literals only, nothing is evaluated.
A bare `[...]` in prose counts only when it parses as a list of calls with keyword arguments, so
`[len(x)]` in an explanation is not a call; inside a wrapper anything is an attempt."""

from __future__ import annotations

import ast
import math
import re
import warnings

from .jsontext import JSONFault, Reader, broken_call, skip_ws
from .model import Group, TextCall
from .scan import each_marker

_WRAPPERS = (("<function_calls>", "</function_calls>"), ("<|python_start|>", "<|python_end|>"))
_BARE = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PY_TOKEN = re.compile(r"[\[\]()'\"]")
_PY_STRING = {"'": re.compile(r"'[^'\\\n]*(?:\\.[^'\\\n]*)*'"), '"': re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"')}
_LEADING_NAME = re.compile(r"\s*\[?\s*([A-Za-z_][\w.]*)\s*\(")
PYTHON_TAG = "<|python_tag|>"
_END_TOKENS = ("<|eom_id|>", "<|eot_id|>")
_BUILTIN = re.compile(r"([A-Za-z_]\w*)\.call\(")

# Where each format's call can begin.
MARKERS = {"pythonic": ("[", *(open_ for open_, _ in _WRAPPERS)), "python_tag": (PYTHON_TAG,)}


def find_wrapped_pythonic(text: str, tool_names) -> list[Group]:
    groups: list[Group] = []
    for open_tag, close_tag in _WRAPPERS:
        pos = 0
        while (start := text.find(open_tag, pos)) >= 0:
            body = start + len(open_tag)
            close = text.find(close_tag, body)
            body_end = close if close >= 0 else len(text)
            end = close + len(close_tag) if close >= 0 else len(text)
            calls = _calls_in(text[body:body_end], body, (start, end), strict=False)
            groups.append(Group((start, end), tuple(calls)))
            pos = end
    return sorted(groups, key=lambda g: g.span)


def find_bare_pythonic(text: str, tool_names) -> list[Group]:
    groups: list[Group] = []
    budget = len(text) + 200_000  # about one full scan: only unclosed brackets scan far
    pos = 0
    while budget > 0 and (match := _BARE.search(text, pos)) is not None:
        start = match.start()
        end, cost = _closing(text, start)
        budget -= cost
        if end is None:
            pos = match.end()
            continue
        calls = _calls_in(text[start:end], start, (start, end), strict=True)
        if calls:
            groups.append(Group((start, end), tuple(calls)))
            pos = end
        else:
            pos = match.end()
    return groups


def find_python_tag(text: str, tool_names) -> list[Group]:
    def read(start: int, body: int, limit: int) -> Group:
        calls, end = _python_tag_body(text, start, body, limit, tool_names)
        for token in _END_TOKENS:
            if text.startswith(token, skip_ws(text, end)):
                end = skip_ws(text, end) + len(token)
        return Group((start, end), tuple(calls))

    return each_marker(text, PYTHON_TAG, read)


def _python_tag_body(text: str, start: int, body: int, limit: int, tool_names) -> tuple[list[TextCall], int]:
    calls: list[TextCall] = []
    reader = Reader(text, "python_tag", tool_names)
    j = skip_ws(text, body)
    while j < limit:
        if text[j] == "{":
            try:
                found, end = reader.calls_at(j)
            except JSONFault as fault:
                calls.append(broken_call(text, j, limit, "python_tag", str(fault)))
                return calls, limit
            if not found:
                break
            calls.extend(found)
        elif (match := _BUILTIN.match(text, j)) is not None:
            end, _ = _closing(text, match.end() - 1)
            if end is None or end > limit:
                calls.append(
                    TextCall(
                        match.group(1),
                        None,
                        text[match.end() : limit].strip(),
                        "python_tag",
                        (j, limit),
                        "unclosed built-in call",
                    )
                )
                return calls, limit
            call = _call_from_source(text[j:end].replace(".call(", "(", 1), (j, end), "python_tag")
            calls.append(call)
        else:
            break
        j = skip_ws(text, end)
        if text.startswith(";", j):
            j = skip_ws(text, j + 1)
    if not calls:
        raw = text[body:limit].strip()
        return [
            TextCall(None, None, raw, "python_tag", (start, limit), "unrecognised text after <|python_tag|>")
        ], limit
    return calls, calls[-1].span[1]


def _closing(text: str, start: int) -> tuple[int | None, int]:
    """Index after the bracket matching text[start], Python-string aware, and the work it took."""
    depth = 0
    pos = start
    while (match := _PY_TOKEN.search(text, pos)) is not None:
        char = match.group(0)
        if char in "'\"":
            string = _PY_STRING[char].match(text, match.start())
            if string is None:
                return None, match.end() - start
            pos = string.end()
            continue
        pos = match.end()
        depth += 1 if char in "[(" else -1
        if depth == 0:
            return pos, pos - start
        if depth < 0:
            return None, pos - start
    return None, len(text) - start


def _calls_in(source: str, offset: int, span: tuple[int, int], strict: bool) -> list[TextCall]:
    """Calls in a pythonic source fragment. strict: a bare list in prose, which must be clean."""
    stripped = source.strip()
    base = offset + len(source) - len(source.lstrip())
    try:
        tree = _parse(stripped, "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        if strict:
            return []
        match = _LEADING_NAME.match(stripped)
        return [
            TextCall(match.group(1) if match else None, None, stripped, "pythonic", span, f"not valid Python: {exc}")
        ]
    statements = [st.value for st in tree.body if isinstance(st, ast.Expr)]
    if len(statements) != len(tree.body) or (
        strict and (len(statements) != 1 or not isinstance(statements[0], ast.List))
    ):
        return [] if strict else [TextCall(None, None, stripped, "pythonic", span, "not a list of calls")]
    nodes = [n for value in statements for n in (value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])]
    if not nodes or not all(isinstance(n, ast.Call) for n in nodes):
        return [] if strict else [TextCall(None, None, stripped, "pythonic", span, "not a list of calls")]
    if strict and any(n.args or _dotted(n.func) is None for n in nodes):
        return []
    return [_call(node, stripped, _node_span(stripped, node, base) or span) for node in nodes]


def _parse(source: str, mode: str) -> ast.AST:
    """ast.parse without the SyntaxWarnings (invalid escapes) it would print on the hot path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, mode=mode)


def _call_from_source(source: str, span: tuple[int, int], fmt: str) -> TextCall:
    try:
        node = _parse(source, "eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return TextCall(None, None, source, fmt, span, f"not valid Python: {exc}")
    if not isinstance(node, ast.Call):
        return TextCall(None, None, source, fmt, span, "not a call")
    call = _call(node, source, span)
    return TextCall(call.name, call.arguments, call.raw_arguments, fmt, span, call.error)


def _node_span(source: str, node: ast.expr, base: int) -> tuple[int, int] | None:
    """Character span of an ast node in the text (ast counts columns in UTF-8 bytes)."""
    if node.end_lineno is None or node.end_col_offset is None:
        return None
    lines = source.splitlines(keepends=True)

    def offset(lineno: int, col: int) -> int:
        before = sum(len(line) for line in lines[: lineno - 1])
        return before + len(lines[lineno - 1].encode("utf-8")[:col].decode("utf-8", "ignore"))

    return base + offset(node.lineno, node.col_offset), base + offset(node.end_lineno, node.end_col_offset)


def _call(node: ast.Call, source: str, span: tuple[int, int]) -> TextCall:
    name = _dotted(node.func)
    raw = _arguments_source(node, source)
    if name is None:
        return TextCall(None, None, raw, "pythonic", span, "call target is not a name")
    if node.args:
        return TextCall(name, None, raw, "pythonic", span, "positional arguments have no parameter names")
    arguments: dict[str, object] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return TextCall(name, None, raw, "pythonic", span, "**kwargs is not a literal argument")
        try:
            value = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return TextCall(name, None, raw, "pythonic", span, f"argument {keyword.arg!r} is not a literal")
        if not _jsonable(value):
            return TextCall(name, None, raw, "pythonic", span, f"argument {keyword.arg!r} has no JSON equivalent")
        arguments[keyword.arg] = _to_json(value)
    return TextCall(name, arguments, raw, "pythonic", span)


def _dotted(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = _dotted(func.value)
        return f"{base}.{func.attr}" if base else None
    return None


def _arguments_source(node: ast.Call, source: str) -> str:
    segment = ast.get_source_segment(source, node) or ""
    opened = segment.find("(")
    return segment[opened + 1 : -1].strip() if opened >= 0 else ""


def _jsonable(value: object) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return False


def _to_json(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value
