"""The one fixed text that tells a model which tools exist and how to call them (hint, text).

A control, not a tuned prompt: the same rendering for every model and every stack, changed only
with a toolproxy release (tests/data/hint_golden.txt pins it byte for byte). The call format it
teaches is Hermes-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`: the most
widely trained text format (Qwen, Hermes, many fine-tunes) and one `toolproxy.calls.parse_text`
recognises. The same helpers render earlier calls and tool results when the text condition
rewrites a conversation's history, so the model sees its past calls in the format it is taught.

The constrained condition shows the same tool descriptions with a JSON-object reply format
instead, because there the schema, not a tag, carries the call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
FINAL_ANSWER = "final_answer"


def dumps(value: Any) -> str:
    """Compact JSON as models most often see it in training data (Python's default separators)."""
    return json.dumps(value, ensure_ascii=False)


def tool_functions(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """The function definitions of an OpenAI/Ollama `tools` array, skipping entries that are not functions."""
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        fn = tool.get("function") if tool.get("type", "function") == "function" else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn["name"]:
            out.append(dict(fn))
    return out


def arguments_value(arguments: Any) -> Any:
    """Call arguments as an object whether sent as a JSON string (OpenAI) or an object (Ollama).

    Arguments that are not JSON stay the string they were: the model sees what it really sent."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments


def format_call(name: str, arguments: Any) -> str:
    """One call in the taught text format."""
    return f'{CALL_OPEN}{{"name": {dumps(name)}, "arguments": {dumps(arguments_value(arguments))}}}{CALL_CLOSE}'


def format_result(call_id: str | None, name: str | None, content: str) -> str:
    attrs = "".join(f' {key}="{value}"' for key, value in (("id", call_id), ("name", name)) if value)
    return f"<tool_result{attrs}>\n{content}\n</tool_result>"


def _type_text(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        text = " or ".join(str(k) for k in kind)
    elif isinstance(kind, str):
        text = kind
        if kind == "array" and isinstance(schema.get("items"), Mapping) and schema["items"].get("type"):
            text = f"array of {_type_text(schema['items'])}"
    elif "anyOf" in schema or "oneOf" in schema:
        text = "one of several shapes"
    else:
        text = "any"
    return text


def _parameter_lines(parameters: Mapping[str, Any]) -> list[str]:
    props = parameters.get("properties")
    if not isinstance(props, Mapping) or not props:
        return ["Parameters: none."]
    required = set(parameters.get("required") or ())
    lines = ["Parameters:"]
    for pname, pschema in props.items():
        pschema = pschema if isinstance(pschema, Mapping) else {}
        bits = [_type_text(pschema), "required" if pname in required else "optional"]
        if isinstance(pschema.get("enum"), list):
            bits.append("one of " + ", ".join(dumps(v) for v in pschema["enum"]))
        if "default" in pschema:
            bits.append(f"default {dumps(pschema['default'])}")
        line = f"- {pname} ({', '.join(bits)})"
        desc = pschema.get("description")
        if isinstance(desc, str) and desc.strip():
            line += f": {' '.join(desc.split())}"
        lines.append(line)
    return lines


def _tool_section(fn: Mapping[str, Any]) -> str:
    lines = [f"## {fn['name']}"]
    desc = fn.get("description")
    if isinstance(desc, str) and desc.strip():
        lines.append(desc.strip())
    parameters = fn.get("parameters") if isinstance(fn.get("parameters"), Mapping) else {}
    lines.extend(_parameter_lines(parameters))
    lines.append(f"JSON Schema of the arguments: {dumps(parameters or {'type': 'object'})}")
    return "\n".join(lines)


def _tool_sections(functions: list[dict[str, Any]]) -> str:
    names = ", ".join(fn["name"] for fn in functions)
    sections = "\n\n".join(_tool_section(fn) for fn in functions)
    return f"Allowed tool names: {names}\n\n{sections}"


def render_block(tools: Iterable[Any]) -> str:
    """The hint/text block for an OpenAI-style `tools` array."""
    functions = tool_functions(tools)
    example = format_call("TOOL_NAME", {"ARGUMENT": "VALUE"})
    return (
        "# Tools\n\n"
        "You can call the tools described below. To call a tool, write the call in exactly this format:\n"
        f"{example}\n"
        "Use one <tool_call> block per call; the arguments are a JSON object that follows the tool's "
        "parameter schema. Call only the tools listed here. After a call, stop and wait: the result "
        'comes back as <tool_result id="..." name="...">...</tool_result>. When no tool is needed, '
        "answer in plain text without any <tool_call>.\n\n"
        f"{_tool_sections(functions)}\n"
    )


def render_constrained_block(tools: Iterable[Any], *, forced: bool = False) -> str:
    """The block for the constrained condition: the reply itself is one JSON object."""
    functions = tool_functions(tools)
    stop = (
        ""
        if forced
        else (f' When you need no tool (or have finished), reply {{"{FINAL_ANSWER}": "your answer"}} instead.')
    )
    return (
        "# Tools\n\n"
        "You can call the tools described below. Reply with exactly one JSON object of the form "
        '{"name": "TOOL_NAME", "arguments": {...}} to call a tool; the arguments follow the tool\'s '
        f"parameter schema.{stop} Tool results come back as "
        '<tool_result id="..." name="...">...</tool_result>.\n\n'
        f"{_tool_sections(functions)}\n"
    )
