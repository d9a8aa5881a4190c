"""The scripted model behind every emulator: what it replies, and how it writes calls as text.

A test decides what the model produced (`Reply` values queued on the server or a responder
given each `ModelRequest`); the emulated stack decides what of it reaches the wire, so the same
model behaviour can be seen through every stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(frozen=True)
class ToolCall:
    """One call as the model meant it. `arguments` may be a str to script malformed JSON."""

    name: str
    arguments: Any = field(default_factory=dict)


@dataclass(frozen=True)
class ScriptedReply:
    """What the model produced for one request.

    `calls` are calls in the format the stack's parser expects: a stack with a parser returns them
    as native `tool_calls`, one without leaves them in `content` as text (see FakeStack.call_format).
    `broken` is call-shaped text the stack's parser chokes on. `error` makes the stack answer with
    its own error format instead of running the model.
    """

    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    finish_reason: str | None = None
    broken: str | None = None
    error: tuple[int, str] | None = None


def text(content: str, *, reasoning: str | None = None, finish_reason: str | None = None) -> ScriptedReply:
    """Plain text, returned verbatim as `content` by every stack (never parsed)."""
    return ScriptedReply(content=content, reasoning=reasoning, finish_reason=finish_reason)


def call(name: str, arguments: Any = None, *, content: str = "") -> ScriptedReply:
    """One well-formed call in the model's trained format."""
    return ScriptedReply(content=content, calls=(ToolCall(name, {} if arguments is None else arguments),))


def calls(*items: ToolCall | tuple[str, Any], content: str = "") -> ScriptedReply:
    """Parallel calls: `calls(("a", {...}), ("b", {...}))`."""
    return ScriptedReply(content=content, calls=tuple(c if isinstance(c, ToolCall) else ToolCall(*c) for c in items))


def text_call(fmt: str, name: str, arguments: Any = None, *, before: str = "", after: str = "") -> ScriptedReply:
    """Text that holds a call in some format (see CALL_FORMATS); no stack parses it."""
    return text(before + render_calls(fmt, [ToolCall(name, {} if arguments is None else arguments)]) + after)


def broken_call(raw: str) -> ScriptedReply:
    """Call-shaped output the stack's parser fails on (llama.cpp 500, Ollama 500, others: text)."""
    return ScriptedReply(broken=raw)


def error(status: int, message: str) -> ScriptedReply:
    """The stack answers `status` in its own error format (e.g. out of memory, context too long)."""
    return ScriptedReply(error=(status, message))


def args_text(arguments: Any) -> str:
    """Arguments as a model writes them in text (Python-json spacing), or verbatim when scripted as str."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def args_compact(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


def _pythonic_value(v: Any) -> str:
    return repr(v) if not isinstance(v, (dict, list, bool)) or isinstance(v, bool) else orjson.dumps(v).decode()


CALL_FORMATS: dict[str, Callable[[list[ToolCall]], str]] = {
    "hermes": lambda cs: "\n".join(
        f'<tool_call>\n{{"name": "{c.name}", "arguments": {args_text(c.arguments)}}}\n</tool_call>' for c in cs
    ),
    "llama3": lambda cs: "; ".join(f'{{"name": "{c.name}", "parameters": {args_text(c.arguments)}}}' for c in cs),
    "mistral": lambda cs: (
        "[TOOL_CALLS][" + ", ".join(f'{{"name": "{c.name}", "arguments": {args_text(c.arguments)}}}' for c in cs) + "]"
    ),
    "pythonic": lambda cs: (
        "["
        + ", ".join(
            f"{c.name}(" + ", ".join(f"{k}={_pythonic_value(v)}" for k, v in (c.arguments or {}).items()) + ")"
            for c in cs
        )
        + "]"
    ),
    "lmstudio": lambda cs: "".join(
        f'[TOOL_REQUEST]{{"name": "{c.name}", "arguments": {args_text(c.arguments)}}}[END_TOOL_REQUEST]' for c in cs
    ),
    "fenced": lambda cs: "\n".join(
        f'```json\n{{"name": "{c.name}", "arguments": {args_text(c.arguments)}}}\n```' for c in cs
    ),
    "json": lambda cs: "\n".join(f'{{"name": "{c.name}", "arguments": {args_text(c.arguments)}}}' for c in cs),
}


def render_calls(fmt: str, cs: list[ToolCall]) -> str:
    try:
        return CALL_FORMATS[fmt](cs)
    except KeyError:
        raise ValueError(f"unknown call format {fmt!r}; choose one of {', '.join(CALL_FORMATS)}") from None


@dataclass
class ModelRequest:
    """What a responder sees: the parsed request, whatever endpoint it came through."""

    stack: str
    path: str
    model: str
    body: dict
    messages: list
    tools: list[str]
    stream: bool
    prompt: str | None = None
    constraint: Any = None
    stops: list[str] = field(default_factory=list)  # the stop strings the request asked for
    # Set by the stack when one of them cut the model's output: the string that matched.
    stopped: str | None = None
    # What the model generated that the stack's parser consumed and returned nothing for.
    eaten: str = ""


DEFAULT_REPLY = text("Hello! How can I help you today?")


def schema_example(schema: Any) -> Any:
    """A value that fits a JSON Schema, as a model that read it would write one: the first of an
    enum, a number 1, a string taken from the description's "e.g." when it has one (the example
    agent's calculator says "e.g. (3 + 4) * 2"), every required property of an object."""
    if not isinstance(schema, dict):
        return {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = [k for k in schema.get("required") or [] if k in props] or list(props)[:1]
        return {k: schema_example(props[k]) for k in required}
    if kind in ("number", "integer"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    described = str(schema.get("description") or "")
    return described.split("e.g.", 1)[1].strip() if "e.g." in described else "example"


def agent_reply(req: ModelRequest) -> ScriptedReply | None:
    """A correct agent's turn: after a tool result, an answer in prose; else a call to the first
    offered tool with arguments that fit its schema (None, the default reply, when none is offered)."""
    last = (req.messages or [{}])[-1]
    if isinstance(last, dict) and last.get("role") in ("tool", "function"):
        return text(f"The tool returned {str(last.get('content'))[:80]}; that is the answer.")
    if not req.tools:
        return None
    for tool in req.body.get("tools") or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(fn, dict) and fn.get("name") == req.tools[0]:
            return call(req.tools[0], schema_example(fn.get("parameters") or fn.get("input_schema") or {}))
    return call(req.tools[0], {})
