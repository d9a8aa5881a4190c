"""A single attempt's outcome, exactly in the order README's "Analysis" gives.

Pure: it sees the reassembled reply the *harness* got, the transport facts (status, error kind)
and the tools the request offered, and returns plain data. The order matters and is the point:
a serving failure (refusal, timeout, empty body) is decided before anything looks at calls, so it
can never be counted as "the model made no tool call".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from toolproxy.analysis.outcomes import HALLUCINATED, INVALID_ARGS, NON_RESPONSE, PROSE, UNPARSEABLE, VALID_CALL
from toolproxy.analysis.protocols import read_reply
from toolproxy.analysis.textparse import parsed_text
from toolproxy.calls import Validation, parse_arguments, validate_call
from toolproxy.wire import Reply, tool_names as names_of_tools

# A 4xx that names the tool interface: the stack rejected the request for what it asked, before
# the model ran (Ollama "does not support tools", vLLM "auto" tool choice flags, tool_choice
# errors, template/jinja problems).
_REFUSAL_4XX = re.compile(
    r"\btools?\b|tool[ _-]?(?:choice|calls?|parser)|function[ _]?call|capabilit|jinja|chat[ _]template", re.IGNORECASE
)
# llama.cpp started with --no-jinja answers a tools request with HTTP 500 "tools param requires
# --jinja flag". It is a 5xx only by that server's choice of status code: it is deterministic,
# happens before the model runs and is about the tools parameter, i.e. a refusal in every sense
# that matters here. Other 5xx that mention tools (e.g. llama.cpp "Failed to parse input at
# pos N: <tool_call>...") are failures *after* generation and stay http_5xx.
_REFUSAL_5XX = re.compile(r"requires --jinja|tools param requires|does not support tools", re.IGNORECASE)

# error_kind (from the proxy) -> sub-kind when nothing usable reached the harness
_ERROR_KINDS = {
    "connect": "connect",
    "timeout": "timeout",
    "upstream_closed": "truncated",
    "client_closed": "truncated",
}


@dataclass(slots=True)
class CallResult:
    idx: int
    name: str | None
    arguments_raw: str | None
    arguments: Any
    surface: str
    format: str
    offered: bool
    validated: bool
    valid: bool
    schema_errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Classification:
    outcome: str
    sub_kind: str | None = None
    surface: str | None = None
    calls: list[CallResult] = field(default_factory=list)
    harness_saw_prose: bool = False
    detail: str | None = None


def refusal(status: int, message: str | None) -> bool:
    if not message:
        return False
    if 400 <= status < 500:
        return _REFUSAL_4XX.search(message) is not None
    return _REFUSAL_5XX.search(message) is not None


def non_response(reply: Reply | None, status: int | None, error_kind: str | None) -> tuple[str, str] | None:
    """(sub_kind, detail) when no model output reached the harness, else None. The first step of that order."""
    has_output = reply is not None and reply.has_output
    if error_kind is not None and not has_output:
        kind = _ERROR_KINDS.get(error_kind)
        if kind is not None:
            return kind, error_kind
    if status is not None and status >= 400:
        message = (reply.error or reply.raw_text) if reply is not None else None
        if refusal(status, message):
            return "refused", message
        return ("http_4xx" if status < 500 else "http_5xx"), message
    if error_kind is not None and not has_output:
        return "http_5xx", error_kind
    if reply is None or reply.empty_body:
        return "empty", "empty body"
    if reply.error is not None and not has_output:
        # An error object with a 2xx status (Ollama reports a failed parse mid-stream this way).
        if refusal(400, reply.error):
            return "refused", reply.error
        return "http_5xx", reply.error
    if reply.unreadable is not None:
        return "empty", reply.unreadable
    if not has_output:
        if reply.streamed and not reply.complete:
            return "truncated", "stream ended before any content"
        if reply.completion_tokens:
            # The stack says the model generated tokens, yet none reached the harness: the model
            # ran and the server ate its output (a parser that consumed the text, a filter).
            return "swallowed", f"nothing delivered although the stack reports {reply.completion_tokens} completion tokens"
        return "empty", "no content and no tool calls" if reply.n_choices else "no choices"
    return None


def classify(
    reply: Reply | None,
    *,
    status: int | None,
    error_kind: str | None,
    tools: list | None,
    call_surface: str = "native",
    tool_names: list[str] | None = None,
    tool_set: str | None = None,
    protocol: str | None = None,
) -> Classification:
    """The outcome of one attempt.

    `call_surface` is what calls in `message.tool_calls` are: "native" when the stack put them
    there, "text" when toolproxy's text/template condition parsed them out of the upstream's text,
    "constrained" when they came from schema-constrained output. `tool_names` may be passed when
    the caller already has the offered names (it caches them per tool set), and `tool_set` (the
    tools array's content hash) lets validation results be reused across attempts: harnesses
    resend the same tools, and looping agents the same call, many times. `protocol`: the prompt
    protocol the request was read under (analysis.protocols); calls in the reply text are then read
    by its rules and have the surface "prompt" (the harness asked for them there and parses them).
    """
    nr = non_response(reply, status, error_kind)
    if nr is not None:
        return Classification(NON_RESPONSE, sub_kind=nr[0], detail=nr[1])
    assert reply is not None
    names = tool_names if tool_names is not None else names_of_tools(tools)
    calls: list[CallResult] = []
    for tc in reply.tool_calls:
        raw = tc.arguments
        if isinstance(raw, str):
            value, error = parse_arguments(raw)
        else:
            value, error = raw, None
            raw = None if raw is None else orjson.dumps(raw).decode()
        # A string's decoded value is a function of the string: it keys the validation cache as is.
        key = tc.arguments if isinstance(tc.arguments, str) else None
        calls.append(_checked(len(calls), tc.name, raw, value, error, call_surface, "tool_calls", tools, tool_set, key))
    attempted = False
    saw_prose = False
    if not calls:
        for text in (reply.content, reply.reasoning_content) if protocol is None else (reply.content,):
            if not text:
                continue
            parsed = parsed_text(text, names) if protocol is None else read_reply(protocol, text, tools)
            attempted = attempted or parsed.attempted
            surface = "text" if protocol is None else "prompt"
            for c in parsed.calls:
                calls.append(_checked(len(calls), c.name, c.raw_arguments, c.arguments, c.error, surface, c.format, tools, tool_set))
            if calls:
                break
        saw_prose = any(c.valid for c in calls)
    surface = calls[0].surface if calls else None
    named = [c for c in calls if c.name is not None]
    if any(not c.offered for c in named):
        outcome = HALLUCINATED
    elif any(not c.valid for c in named):
        outcome = INVALID_ARGS
    elif named:
        outcome = VALID_CALL
    elif calls or attempted:
        outcome = UNPARSEABLE
        surface = None
    else:
        outcome = PROSE
    return Classification(outcome, surface=surface, calls=calls, harness_saw_prose=saw_prose)


_VALIDATIONS: dict[tuple, Validation] = {}


def _validate(name: str, arguments: Any, tools: list | None, tool_set: str | None, raw: str | None) -> Validation:
    """validate_call, cached by tool set, name and arguments: by the arguments' JSON text when the
    call came as text (`raw`, cheap to hash), else by their key-sorted JSON (bytes, so the two
    kinds of key never meet)."""
    if tool_set is None:
        return validate_call(name, arguments, tools)
    try:
        key = (tool_set, name, raw if raw is not None else orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS))
    except TypeError:
        return validate_call(name, arguments, tools)
    hit = _VALIDATIONS.get(key)
    if hit is None:
        if len(_VALIDATIONS) >= 65536:
            _VALIDATIONS.clear()
        hit = _VALIDATIONS[key] = validate_call(name, arguments, tools, tools_key=tool_set)
    return hit


def _checked(idx, name, raw, value, parse_error, surface, fmt, tools, tool_set, key=None) -> CallResult:
    """The call's row. `key`: the arguments string `value` was decoded from, if it was (native calls)."""
    if name is None:
        return CallResult(idx, None, raw, None, surface, fmt, False, False, False, [parse_error or "no tool name recovered"])
    # Unparseable arguments go in raw so validate_call reports them as "not valid JSON".
    v = _validate(name, raw if parse_error is not None else value, tools, tool_set, key)
    return CallResult(idx, name, raw, None if parse_error else value, surface, fmt, v.offered, v.validated, v.valid, list(v.errors))
