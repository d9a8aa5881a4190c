"""Are tool definitions reaching the model as JSON? A template can silently render them otherwise.

Two known ways it goes wrong, both invisible on the wire (the request and the response look fine;
the model just reads garbage):
- Ollama (Go templates), ollama/ollama#14601: since 0.14.0 (#13525) `{{ .Function }}` and
  `{{ .Function.Parameters }}` print Go struct syntax, e.g. `{get_weather Get ... {object [city]
  map[...]}}`, because those two template types lost their JSON `String()` methods.
- Jinja templates that print a tool without `| tojson` give a Python dict repr
  (`{'type': 'function', ...}`), which is not JSON either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_GO_STRUCT = re.compile(r"map\[[A-Za-z_\"]|\{Type:|\{Name:|Properties:map\[|\{object \[")
_PY_REPR = re.compile(r"\{'(?:type|name|function|parameters|properties)': ")
_RANGE_TOOLS = re.compile(r"\{\{-?\s*range\s+(?:\$\w+\s*,?\s*(?:\$\w+\s*)?:=\s*)?\.Tools\s*-?\}\}")
_STRUCT_PRINT = re.compile(r"\{\{-?\s*(\.Function(?:\.Parameters)?)\s*-?\}\}")
_END = re.compile(r"\{\{-?\s*end\s*-?\}\}")
_BLOCK_OPEN = re.compile(r"\{\{-?\s*(?:if|range|with|block|define)\b")


@dataclass(frozen=True, slots=True)
class TemplateFinding:
    ok: bool
    summary: str
    evidence: str | None = None


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(g or 0) for g in m.groups()) if m else None


def _range_tools_bodies(template: str) -> list[str]:
    """The bodies of every `{{ range .Tools }}` block, with nested blocks balanced."""
    bodies = []
    for m in _RANGE_TOOLS.finditer(template):
        depth, pos = 1, m.end()
        while depth:
            opener = _BLOCK_OPEN.search(template, pos)
            end = _END.search(template, pos)
            if end is None:
                break
            if opener is not None and opener.start() < end.start():
                depth, pos = depth + 1, opener.end()
            else:
                depth, pos = depth - 1, end.end()
        bodies.append(template[m.end() : pos])
    return bodies


def check_ollama_template(template: str, version: str | None) -> TemplateFinding:
    """Static check of an Ollama model template for the #14601 pattern."""
    for body in _range_tools_bodies(template):
        m = _STRUCT_PRINT.search(body)
        if m is None:
            continue
        v = _version_tuple(version)
        affected = v is None or v >= (0, 14, 0)
        where = f"`{m.group(0)}` inside `range .Tools`"
        if affected:
            return TemplateFinding(
                False,
                f"the model's template prints {where}; on Ollama {version or '(version unknown)'} that renders "
                "the tool as Go struct syntax, not JSON (ollama/ollama#14601), so the model reads mangled tool "
                "definitions. Fix: a Modelfile TEMPLATE that prints `{{ .Function.Name }}`/`{{ .Function.Parameters "
                "}}` "
                "field by field as JSON, an Ollama release with the fix, or toolproxy `--condition text`",
                m.group(0),
            )
        return TemplateFinding(
            True,
            f"the template prints {where}: JSON on Ollama {version}, but Go struct syntax from 0.14.0 on "
            "(ollama/ollama#14601); re-check after upgrading",
            m.group(0),
        )
    if ".Tools" not in template:
        return TemplateFinding(
            False, "the model's template never mentions .Tools: tool definitions are not rendered into the prompt"
        )
    return TemplateFinding(True, "tool definitions are rendered by the template without struct printing")


def check_rendered_prompt(prompt: str, tool_name: str) -> TemplateFinding:
    """Check a prompt the stack rendered for a request with tools (llama.cpp POST /apply-template)."""
    for pattern, what in ((_GO_STRUCT, "Go struct syntax"), (_PY_REPR, "a Python dict repr")):
        m = pattern.search(prompt)
        if m is not None:
            lo = max(0, m.start() - 40)
            return TemplateFinding(
                False, f"the rendered prompt shows the tool definitions as {what}, not JSON", prompt[lo : m.end() + 60]
            )
    if tool_name not in prompt:
        return TemplateFinding(
            False,
            f"the rendered prompt does not contain the tool name {tool_name!r}: "
            "the template drops the tool definitions",
        )
    return TemplateFinding(True, "tool definitions are rendered into the prompt as JSON")
