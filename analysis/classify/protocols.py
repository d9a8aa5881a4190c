"""Prompt protocols: agents that send no `tools` field, write the tool list into the prompt and
read the call back out of the reply text.

Three are recognised, each by markers its harness always writes (conservatively: a plain chat
that merely talks about tools reads as no protocol at all):

- `dspy`: dspy's ReAct over the ChatAdapter's fields. The system message lists the tools ("(1)
  get_weather, whose description is <desc>...</desc>. It takes arguments {...}.") and asks for
  `[[ ## next_tool_name ## ]]` and `[[ ## next_tool_args ## ]]`; the trajectory so far is rewritten
  into the user message every step (`thought_N`, `tool_name_N`, `tool_args_N`, `observation_N`).
  Its last step (the extract that writes the answer) carries the trajectory but offers no tools.
- `react`: the classic "Thought / Action / Action Input / Observation" text loop (LangChain's
  ReAct prompt and the many like it): the tools are listed before the format, "Action: the action
  to take, should be one of [names]" names them, and the scratchpad grows at the end of the prompt.
- `code`: tools offered as Python function stubs (smolagents' CodeAgent), the call written in a
  code block (`<code>...</code>` or a ```py fence) and run by the harness, its output sent back as
  an "Observation:" message.

A recognised request is read into the conversation a chat harness would have sent (analysis works
on that alone): the tools as function tools, the trajectory as assistant messages whose calls are
the steps' calls, followed by `tool` messages holding the observations. A reply is read into its
calls by the same rules, so a step's reply and the same step written back into the next prompt
give one canonical message, and episodes chain as they do for any harness (analysis.episodes.build).

Input is model- and harness-written text: everything is bounded and never raises.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from toolproxy.calls import TextCall, TextParse, parse_arguments

DSPY, REACT, CODE = "dspy", "react", "code"
PROMPT_PROTOCOLS = (DSPY, REACT, CODE)
# Longest message read for a protocol: prompts are a few KB; a huge message is not a tool list.
MAX_TEXT = 256 * 1024
_MAX_STEPS = 256
_MAX_TOOLS = 128


@dataclass(frozen=True, slots=True)
class Reading:
    """A request read under a prompt protocol. `tools`: the tools its prompt offers (chat-completions
    function tools), None when this step offers none (dspy's extract); `messages`: the conversation
    in chat terms. `fallback`: written in the format the harness falls back to when it could not
    parse a reply (dspy's JSONAdapter after the ChatAdapter's fields), so it may be the step just
    asked, asked again."""

    protocol: str
    tools: list[dict] | None
    messages: list[dict]
    fallback: bool = False


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def read_prompt(messages: Sequence[Any]) -> Reading | None:
    """The request under the prompt protocol its messages show, or None (most requests)."""
    texts = [_text(m.get("content")) if isinstance(m, dict) else None for m in messages]
    if not any(t and len(t) <= MAX_TEXT for t in texts):
        return None
    for reader in (_read_dspy, _read_react, _read_code):
        reading = reader(messages, texts)
        if reading is not None:
            return reading
    return None


def read_reply(protocol: str, text: str | None, tools: list[dict] | None) -> TextParse:
    """The calls a reply writes under `protocol` (calls to tools not offered included: a call's name
    is kept whatever it is, and validation judges it)."""
    if not text or len(text) > MAX_TEXT:
        return TextParse((), False, text or "")
    if protocol == DSPY:
        return _dspy_reply(text)
    if protocol == REACT:
        return _react_reply(text, tools)
    if protocol == CODE:
        return _code_reply(text, tools)
    return TextParse((), False, text)


def reply_message(protocol: str, text: str | None, calls: list) -> tuple[str, list]:
    """(content, calls) of a reply (its text and the (name, arguments) read_reply found in it) in the
    canonical form read_prompt gives the same step when the harness writes it back."""
    text = text or ""
    if protocol == DSPY:
        fields = _fields(text) or _json_fields(text)
        return (fields.get("next_thought", text) if fields else text).strip(), calls
    if protocol == REACT:
        return _react_thought(text), calls
    if protocol == CODE:
        # The code alone: it decides the calls, and a wrap-up request that offers no tools (so reads
        # no calls in it) still writes the same message back.
        # smolagents closes a reply with its closing tag before writing it back, code or not.
        blocks = _code_blocks(text)
        return (blocks[0] if blocks else text.strip().removesuffix("</code>")).strip(), []
    return text, calls


# ---------------------------------------------------------------- tools as their prompts write them

_PY_TYPES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "list": "array",
    "dict": "object",
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
    "array": "array",
    "object": "object",
}


def _pairs(parse: TextParse) -> list:
    """A parse's calls as (name, arguments), the raw arguments where they did not parse."""
    return [(c.name, c.arguments if c.error is None else c.raw_arguments) for c in parse.calls]


def _function_tool(name: str, description: str, parameters: dict) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": description.strip(), "parameters": parameters},
    }


def _signature(sig: str, typed: bool) -> dict | None:
    """The parameters schema of a Python signature `(a: str, b: int = 1) -> str` (parsed, never run);
    None when it does not parse. `typed`: keep the annotations as JSON types."""
    try:
        tree = ast.parse(f"def _{sig}: pass")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef):
        return None
    args = fn.args
    positional = args.posonlyargs + args.args
    required = [a.arg for a in positional[: len(positional) - len(args.defaults)]]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
    properties: dict[str, dict] = {}
    for a in positional + args.kwonlyargs:
        note = a.annotation
        name = (
            note.value
            if isinstance(note, ast.Constant) and isinstance(note.value, str)
            else (note.id if isinstance(note, ast.Name) else None)
        )
        kind = _PY_TYPES.get(name or "")
        properties[a.arg] = {"type": kind} if typed and kind else {}
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if args.kwarg is None:
        schema["additionalProperties"] = False
    return schema


def _order(tools: list[dict] | None) -> dict[str, list[str]]:
    """Each offered tool's parameter names in order (for positional arguments)."""
    out = {}
    for t in tools or ():
        fn = t.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name")] = list(props)
    return out


# ---------------------------------------------------------------- dspy: ReAct over [[ ## field ## ]] markers

_FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]")
_DSPY_TOOL = re.compile(r"\((\d+)\) ([A-Za-z_][\w.-]{0,127}), whose description is <desc>")
_DSPY_ARGS = "</desc>. It takes arguments "
_RESPOND = "\n\nRespond with "
_STEP = re.compile(r"(thought|tool_name|tool_args|observation)_(\d+)")
# The adapter's part of a system message, between dspy's field list and the task's instructions.
_STRUCTURE = "All interactions will be structured in the following way"
_OBJECTIVE = "In adhering to this structure, your objective is:"
_JSON_OUTPUTS = "Outputs will be a JSON object with the following fields."


def _fields(text: str) -> dict[str, str]:
    """A ChatAdapter text's fields: name -> value (stripped), in order."""
    marks = list(_FIELD.finditer(text))
    out = {}
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        out[m.group(1)] = text[m.end() : end].strip()
    return out


def _dspy_tools(system: str) -> list[dict]:
    """The tools a ReAct signature lists: `(N) name, whose description is <desc>D</desc>. It takes
    arguments {...}.` (the arguments a Python literal of JSON Schemas, on the rest of the line)."""
    tools = []
    for m in list(_DSPY_TOOL.finditer(system))[:_MAX_TOOLS]:
        end = system.find(_DSPY_ARGS, m.end())
        if end < 0:
            continue
        line = system[end + len(_DSPY_ARGS) :].split("\n", 1)[0].strip()
        args = _literal(line[:-1] if line.endswith(".") else line)
        if isinstance(args, dict) and all(isinstance(k, str) and isinstance(v, dict) for k, v in args.items()):
            params = {"type": "object", "properties": args, "required": list(args), "additionalProperties": False}
        else:
            params = {}
        tools.append(_function_tool(m.group(2), system[m.end() : end], params))
    return tools


def _read_dspy(messages: Sequence[Any], texts: list[str | None]) -> Reading | None:
    system, user = texts[0] if texts else None, texts[-1]
    if (
        not system
        or not user
        or len(messages) < 2
        or "Your output fields are:" not in system
        or len(system) > MAX_TEXT
        or len(user) > MAX_TEXT
    ):
        return None
    json_format = _JSON_OUTPUTS in system
    if not json_format and "[[ ## completed ## ]]" not in system:
        return None
    if not (
        isinstance(messages[0], dict)
        and messages[0].get("role") == "system"
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "user"
    ):
        return None
    # The trajectory's own fields (thought_0, tool_name_0, ...) follow its marker at the same level.
    fields = _fields(user.split(_RESPOND, 1)[0])
    steps = _trajectory(fields)
    react = "next_tool_name" in system and "next_tool_args" in system
    if react:
        tools = _dspy_tools(system)
        if not tools:
            return None
    elif steps:
        tools = None
    else:
        return None  # a dspy program without tools: no protocol to read
    asked = "\n\n".join(
        f"[[ ## {k} ## ]]\n{v}" for k, v in fields.items() if k != "trajectory" and _STEP.fullmatch(k) is None
    )
    canonical = [{"role": "system", "content": _dspy_task(system)}, *messages[1:-1], {"role": "user", "content": asked}]
    for thought, name, args, observation in steps:
        value, error = parse_arguments(args)
        call = {
            "id": None,
            "type": "function",
            "function": {"name": name, "arguments": value if error is None else args},
        }
        canonical.append({"role": "assistant", "content": thought, "tool_calls": [call]})
        if observation is not None:
            canonical.append({"role": "tool", "content": observation})
    return Reading(DSPY, tools, canonical, fallback=json_format)


def _dspy_task(system: str) -> str:
    """The system message without the part its adapter writes (how fields are laid out, as
    `[[ ## name ## ]]` sections or as a JSON object): one step reads the same under either."""
    start = system.find(_STRUCTURE)
    end = system.find(_OBJECTIVE, start)
    if start < 0 or end < 0:
        return system
    return system[:start] + system[end:]


def _trajectory(fields: dict[str, str]) -> list[tuple[str, str, str, str | None]]:
    """(thought, tool name, tool args, observation) per step of a trajectory, from its fields."""
    steps: dict[int, dict[str, str]] = {}
    for name, value in fields.items():
        m = _STEP.fullmatch(name)
        if m is not None and int(m.group(2)) < _MAX_STEPS:
            steps.setdefault(int(m.group(2)), {})[m.group(1)] = value
    return [
        (s.get("thought", ""), s["tool_name"], s.get("tool_args", "{}"), s.get("observation"))
        for _, s in sorted(steps.items())
        if "tool_name" in s
    ]


def _dspy_reply(text: str) -> TextParse:
    fields = _fields(text)
    if "next_tool_name" not in fields:
        fields = _json_fields(text)
    if "next_tool_name" not in fields:
        return TextParse((), False, text)
    name = fields["next_tool_name"].strip().strip("'\"`")
    raw = fields.get("next_tool_args", "{}")
    if isinstance(raw, dict):
        return TextParse((TextCall(name, raw, orjson.dumps(raw).decode(), DSPY, (0, len(text))),), True, text)
    value, error = parse_arguments(raw)
    if error is not None:
        literal = _literal(raw)
        if isinstance(literal, dict):
            value, error = literal, None
    call = TextCall(name or None, value if error is None else None, raw, DSPY, (0, len(text)), error)
    return TextParse((call,), True, text)


def _json_fields(text: str) -> dict:
    """The JSONAdapter's reply (dspy's fallback when the fields did not parse): one JSON object."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").split("\n", 1)[-1]
    value, error = parse_arguments(body)
    if error is not None or not isinstance(value, dict) or not isinstance(value.get("next_tool_name"), str):
        return {}
    args = value.get("next_tool_args", {})
    return {
        "next_thought": str(value.get("next_thought", "")),
        "next_tool_name": value["next_tool_name"],
        "next_tool_args": args if isinstance(args, dict) else str(args),
    }


def _literal(text: str) -> Any:
    if len(text) > 64 * 1024:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return None


# ---------------------------------------------------------------- react: Thought / Action / Action Input / Observation

_ACTION_LIST = re.compile(r"(?m)^Action:[^\n\[]*\[([^\]\n]{1,2000})\][ \t]*$")
# LangChain's reading (ReActSingleInputOutputParser), in two linear steps: its one regex,
# `Action:(.*?)Action Input:(.*)`, rescans the rest of the text from every "Action:" that has no
# "Action Input:" after it.
_ACTION = re.compile(r"Action\s*\d*\s*:")
_ACTION_INPUT = re.compile(r"Action\s*\d*\s*Input\s*\d*\s*:")
_QUESTION = re.compile(r"(?m)^Question:[^\n]*\n")
_NAME = re.compile(r"[A-Za-z_][\w.-]{0,127}")
_OBSERVATION = "\nObservation:"


def _read_react(messages: Sequence[Any], texts: list[str | None]) -> Reading | None:
    for k, text in enumerate(texts):
        if not text or len(text) > MAX_TEXT or "Action Input:" not in text or "Observation:" not in text:
            continue
        listed = _ACTION_LIST.search(text)
        if listed is None:
            continue
        names = [n.strip() for n in listed.group(1).split(",")]
        if not names or not all(_NAME.fullmatch(n) for n in names):
            continue
        tools = [_react_tool(n, text[: listed.start()]) for n in dict.fromkeys(names)][:_MAX_TOOLS]
        canonical: list[dict] = []
        for j, m in enumerate(messages):
            if j == k:
                canonical += _scratchpad(m, text, listed.end(), tools)
            elif isinstance(m, dict) and m.get("role") == "assistant":
                content = _text(m.get("content")) or ""
                body, calls = reply_message(REACT, content, _pairs(_react_reply(content, tools)))
                canonical.append(_assistant(body, calls))
            else:
                canonical.append(m)
        return Reading(REACT, tools, canonical)
    return None


def _react_tool(name: str, listing: str) -> dict:
    """The tool `name` as the prompt describes it: `name(sig) - description` (LangChain) or
    `name: description`. Without a signature it takes one string, as a single-input tool does."""
    line = re.compile(rf"{re.escape(name)}(\([^\n]*?\)(?:\s*->\s*[^\n]*?)?)?\s*(?: - |: )(.*)")
    m = next((hit for text in listing.splitlines() if len(text) <= 2000 and (hit := line.fullmatch(text))), None)
    params = _signature(m.group(1), typed=True) if m and m.group(1) else None
    if params is None:
        params = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
    return _function_tool(name, m.group(2) if m else "", params)


def _scratchpad(message: Any, text: str, start: int, tools: list[dict]) -> list[dict]:
    """The prompt message holding the format and the scratchpad, as its question plus each step:
    the model's text as an assistant message with its call, the observation as a tool result."""
    questions = list(_QUESTION.finditer(text, start))
    question = questions[-1] if questions else None
    rest = text[question.end() :] if question else ""
    if question is None or not rest.startswith("Thought:"):
        return [message]
    base = text[: question.end() + len("Thought:")]
    out = [{"role": message.get("role") if isinstance(message, dict) else "user", "content": base}]
    parts = rest[len("Thought:") :].split(_OBSERVATION)
    logs, observations = [parts[0]], []
    for part in parts[1:_MAX_STEPS]:
        observation, _, log = part.partition("\nThought:")
        observations.append(observation.strip())
        logs.append(log)
    for log, observation in zip(logs, observations):
        body, calls = reply_message(REACT, log, _pairs(_react_reply(log, tools)))
        out.append(_assistant(body, calls))
        out.append({"role": "tool", "content": observation})
    return out


def _assistant(content: str, calls: list) -> dict:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": None, "type": "function", "function": {"name": n, "arguments": a}} for n, a in calls],
    }


def _action(text: str) -> tuple[int, str, str] | None:
    """(where it starts, the action, its input) of the first action a reply writes, or None."""
    m = _ACTION.search(text)
    if m is None:
        return None
    given = _ACTION_INPUT.search(text, m.end())
    if given is None:
        return None
    return m.start(), text[m.end() : given.start()].strip(), text[given.end() :].strip()


def _react_thought(text: str) -> str:
    head = text.split("Action", 1)[0] if _action(text) else text
    head = head.strip()
    while head.startswith("Thought:"):
        head = head[len("Thought:") :].strip()
    return head


def _react_reply(text: str, tools: list[dict] | None) -> TextParse:
    found = _action(text)
    if found is None:
        attempted = "Final Answer:" not in text and re.search(r"(?m)^[ \t]*Action\s*\d*\s*:", text) is not None
        return TextParse((), attempted, text)
    start, name, raw = found
    raw = raw.split(_OBSERVATION, 1)[0].strip(" ").strip('"').strip()
    value, error = parse_arguments(raw)
    if error is not None or not isinstance(value, dict):
        params = _order(tools).get(name, [])
        if len(params) == 1:
            value, error = {params[0]: raw}, None
        elif error is None:
            error = f"Action Input is not a JSON object for a tool taking {len(params)} arguments"
        else:
            error = f"Action Input is not JSON for a tool taking {len(params)} arguments"
    call = TextCall(name or None, value if error is None else None, raw, REACT, (start, len(text)), error)
    return TextParse((call,), True, text)


# ---------------------------------------------------------------- code: tools as Python functions, calls in code

_STUB = re.compile(r'(?m)^def ([A-Za-z_]\w{0,127})(\([^\n]{0,2000}\)\s*->\s*[^\n:]{1,200}):\s*\n[ \t]+(?:"""|\'\'\')')
_TAGS = re.compile(r"opened with '([^'\n]{1,40})', and closed with '([^'\n]{1,40})'")
_BLOCKS = (("<code>", "</code>"), ("```python", "```"), ("```py", "```"))
# How smolagents writes a code step back into its history: the model's text, then its own record of
# the step as a call to its interpreter.
_CODE_ECHO = re.compile(
    r"Calling tools:\n\[\{'id': '[^']*', 'type': 'function', 'function': \{'name': 'python_interpreter'"
)
_BUILTINS = frozenset(dir(builtins))


def _read_code(messages: Sequence[Any], texts: list[str | None]) -> Reading | None:
    system = texts[0] if texts and isinstance(messages[0], dict) and messages[0].get("role") == "system" else None
    tools = _code_tools(system) if system and len(system) <= MAX_TEXT else []
    if not tools and not any(
        isinstance(m, dict) and m.get("role") == "assistant" and t and _CODE_ECHO.search(t)
        for m, t in zip(messages, texts)
    ):
        return None  # neither tools as functions nor a code agent's steps written back (its wrap-up)
    canonical: list[dict] = []
    for m, text in zip(messages, texts):
        if isinstance(m, dict) and m.get("role") == "assistant":
            body, calls = reply_message(CODE, text, _pairs(_code_reply(text or "", tools)))
            canonical.append(_assistant(body, calls))
        else:
            canonical.append(m)
    return Reading(CODE, tools or None, canonical)


def _code_tools(system: str) -> list[dict]:
    """The tool stubs (`def name(args) -> type:` and a docstring) of a system prompt that asks for
    code blocks."""
    if "def " not in system or (_TAGS.search(system) is None and "<code>" not in system and "```py" not in system):
        return []
    tools = []
    for m in list(_STUB.finditer(system))[:_MAX_TOOLS]:
        params = _signature(m.group(2), typed=False)
        if params is not None:
            tools.append(_function_tool(m.group(1), _docstring(system, m.end()), params))
    return tools


def _docstring(text: str, end: int) -> str:
    """The docstring a stub's opening quotes (ending at `end`) start."""
    close = text.find(text[end - 3 : end], end)
    return text[end:close] if close >= 0 else ""


def _code_blocks(text: str) -> list[str]:
    """The code blocks of a reply, in order: `<code>...</code>` or ```py fences; a last block left
    open (a stop sequence cut its closing tag) runs to the end."""
    out = []
    for opening, closing in _BLOCKS:
        i = 0
        while len(out) < _MAX_STEPS:
            start = text.find(opening, i)
            if start < 0:
                break
            start += len(opening)
            end = text.find(closing, start)
            out.append(text[start : end if end >= 0 else len(text)].strip("\n"))
            if end < 0:
                break
            i = end + len(closing)
        if out:
            return out
    return out


def _code_reply(text: str, tools: list[dict] | None) -> TextParse:
    blocks = _code_blocks(text)
    if not blocks:
        return TextParse((), False, text)
    order = _order(tools)
    calls: list[TextCall] = []
    attempted = False
    for code in blocks:
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            attempted = True
            continue
        defined = _defined(tree)
        for node in ast.walk(tree):
            if len(calls) >= _MAX_STEPS:
                break
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            name = node.func.id
            if name in order:
                calls.append(_code_call(node, order[name]))
            elif tools and name not in defined and name not in _BUILTINS:
                calls.append(_code_call(node, []))  # a function nothing offered or defined: the harness cannot run it
    return TextParse(tuple(calls), attempted or bool(calls), text)


def _defined(tree: ast.AST) -> set[str]:
    """The names a block of code binds itself (assignments, defs, imports, loop and handler names)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def _code_call(node: ast.Call, params: list[str]) -> TextCall:
    """One call in code: positional arguments by the stub's parameter order (a function nothing
    offers has none known: they are named by position); a value that is not a literal (a variable,
    an expression) as its source text, since only running the code knows it."""
    args: dict[str, Any] = {}
    extra = 0
    for k, a in enumerate(node.args):
        if k < len(params):
            args[params[k]] = _value(a)
        elif params:
            extra += 1
        else:
            args[f"_{k}"] = _value(a)
    for kw in node.keywords:
        if kw.arg is not None:
            args[kw.arg] = _value(kw.value)
    raw = _source(node)
    error = f"{extra} positional arguments beyond the tool's parameters" if extra else None
    return TextCall(
        node.func.id, None if error else args, raw, CODE, (node.col_offset, node.end_col_offset or 0), error
    )


def _value(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return _source(node)


def _source(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except (ValueError, RecursionError, MemoryError):
        return "<expression>"
