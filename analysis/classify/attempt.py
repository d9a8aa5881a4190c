"""A single attempt's outcome, exactly in the order docs/analysis.md gives.

Pure: it sees the reassembled reply the *harness* got, the transport facts (status, error kind)
and the tools the request offered, and returns plain data. The order matters and is the point:
a serving failure (refusal, timeout, empty body) is decided before anything looks at calls, so it
can never be counted as "the model made no tool call".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from toolproxy.analysis.classify.outcomes import (
    CLIENT_GAVE_UP,
    HALLUCINATED,
    INVALID_ARGS,
    MODEL_STOPPED,
    NON_RESPONSE,
    PROSE,
    STOP_STRING,
    UNPARSEABLE,
    USER_INTERRUPT,
    VALID_CALL,
)
from toolproxy.analysis.classify.protocols import read_reply
from toolproxy.analysis.classify.textparse import parsed_text
from toolproxy.calls import Validation, parse_arguments, validate_call
from toolproxy.stacks.catalog import LLAMACPP, OLLAMA, TOOL_REFUSAL
from toolproxy.wire import Reply
from toolproxy.wire import tool_names as names_of_tools

# A 4xx that names the tool interface: the stack rejected the request for what it asked, before
# the model ran (Ollama "does not support tools", vLLM "auto" tool choice flags, tool_choice
# errors, template/jinja problems).
_REFUSAL_4XX = re.compile(
    r"\btools?\b|tool[ _-]?(?:choice|calls?|parser)|function[ _]?call|capabilit|jinja|chat[ _]template", re.IGNORECASE
)
# llama.cpp started with --no-jinja answers a tools request with HTTP 500 (its tools refusal in
# the stack catalog). It is a 5xx only by that server's choice of status code: it is deterministic,
# happens before the model runs and is about the tools parameter, i.e. a refusal in every sense
# that matters here; so is Ollama's tools refusal should it come as a 5xx. Other 5xx that mention
# tools (e.g. llama.cpp's parse failure, "Failed to parse input at pos N: <tool_call>...") are
# failures *after* generation and stay http_5xx.
_REFUSAL_5XX = re.compile(
    "|".join(re.escape(s.failures[TOOL_REFUSAL].needle) for s in (LLAMACPP, OLLAMA)), re.IGNORECASE
)

# error_kind (from the proxy) -> sub-kind when nothing usable reached the harness
_ERROR_KINDS = {
    "connect": "connect",
    "timeout": "timeout",
    "upstream_closed": "truncated",
    "client_closed": CLIENT_GAVE_UP,
    USER_INTERRUPT: USER_INTERRUPT,
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


def non_response(
    reply: Reply | None,
    status: int | None,
    error_kind: str | None,
    stops: Sequence[str] = (),
    stack: Reply | None = None,
) -> tuple[str, str] | None:
    """(sub_kind, detail) when no model output reached the harness, else None. The first step of that order.

    `stops`: the stop strings the harness's request asked for; `stack`: the upstream's own reply
    when a condition rewrote what the harness got (its token counts and stop reason are the
    stack's word; `reply` stays what the harness got). Both only matter for an empty reply.
    """
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
        return empty_cause(reply, stops, stack)
    return None


def empty_cause(reply: Reply, stops: Sequence[str] = (), stack: Reply | None = None) -> tuple[str, str]:
    """Why a complete reply delivered nothing: (sub_kind, detail), from the evidence the record holds.

    Three causes, told apart the same way on every protocol, streamed or not:
    - `model_stopped`: the model emitted its end token first. The stack counts that one token (a
      few more if it wrote only whitespace, which is delivered as such), or says `eos`.
    - `stop_string`: a stop string the harness sent was the first thing the model wrote, and the
      stack cut the reply there. The stack names the string (llama.cpp `stopping_word`, SGLang
      `matched_stop`, Anthropic `stop_sequence`), or the request sent stop strings and the count
      is no more than the longest of them could take (a token is at least one byte).
    - `swallowed`: the stack reports more tokens than either accounts for: the model generated
      text and the stack delivered none (a parser that consumed it, Ollama dropping a call to a
      tool it was not offered). The only one of the three that is a serving failure.
    Without a token count or a stop reason nothing tells them apart: `empty`.
    """
    src = stack if stack is not None else reply
    tokens = src.completion_tokens if src.completion_tokens is not None else reply.completion_tokens
    said = src.stop_type or reply.stop_type
    word = src.stop_word or reply.stop_word
    blank = len((reply.content or "").encode()) + len((reply.reasoning_content or "").encode())
    candidates = [word] if word else list(stops)
    if tokens is None or tokens == 0 and said is None:
        if said == "eos":
            return (
                MODEL_STOPPED,
                "the model ended its turn at once: the stack says it stopped at its end token, with no text",
            )
        if said == "word":
            return STOP_STRING, f"a stop string the harness sent cut the reply before any text{_which(word)}"
        return "empty", "no content and no tool calls" if reply.n_choices else "no choices"
    if said != "word" and tokens <= blank + 1:
        return MODEL_STOPPED, (
            f"the model ended its turn at once: {_tokens(tokens)}, its end token"
            + (" and whitespace" if blank else "")
            + ", and no text"
        )
    if said != "eos" and candidates and tokens <= blank + max(len(w.encode()) for w in candidates) + 1:
        if said == "word":
            return (
                STOP_STRING,
                f"a stop string the harness sent cut the reply before any text{_which(word)} ({_tokens(tokens)})",
            )
        return STOP_STRING, (
            f"a stop string the harness sent cut the reply before any text: it asked to stop at "
            f"{', '.join(repr(c) for c in candidates)}, and {_tokens(tokens)} are no more than that accounts for"
        )
    return "swallowed", (
        f"nothing delivered although the stack reports {_tokens(tokens)}, more than an end token"
        + (" or the stop strings sent" if candidates else "")
        + " accounts for"
    )


def _tokens(n: int) -> str:
    return f"{n} completion token{'s' if n != 1 else ''}"


def _which(word: str | None) -> str:
    return f": {word!r}" if word else ""


def classify(
    reply: Reply | None,
    *,
    status: int | None,
    error_kind: str | None,
    tools: list | None,
    call_surface: str = "native",
    tool_names: list[str] | None = None,
    tool_set: str | None = None,
    stops: Sequence[str] = (),
    stack_reply: Reply | None = None,
    protocol: str | None = None,
) -> Classification:
    """The outcome of one attempt.

    `call_surface` is what calls in `message.tool_calls` are: "native" when the stack put them
    there, "text" when toolproxy's text/template condition parsed them out of the upstream's text,
    "constrained" when they came from schema-constrained output. `tool_names` may be passed when
    the caller already has the offered names (it caches them per tool set), and `tool_set` (the
    tools array's content hash) lets validation results be reused across attempts: harnesses
    resend the same tools, and looping agents the same call, many times. `stops` and `stack_reply`
    say why an empty reply was empty (see empty_cause). `protocol`: the prompt protocol the request
    was read under (analysis.classify.protocols); calls in the reply text are then read by its rules and
    have the surface "prompt" (the harness asked for them there and parses them).
    """
    nr = non_response(reply, status, error_kind, stops, stack_reply)
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
                calls.append(
                    _checked(
                        len(calls), c.name, c.raw_arguments, c.arguments, c.error, surface, c.format, tools, tool_set
                    )
                )
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
        return CallResult(
            idx, None, raw, None, surface, fmt, False, False, False, [parse_error or "no tool name recovered"]
        )
    # Unparseable arguments go in raw so validate_call reports them as "not valid JSON".
    v = _validate(name, raw if parse_error is not None else value, tools, tool_set, key)
    return CallResult(
        idx, name, raw, None if parse_error else value, surface, fmt, v.offered, v.validated, v.valid, list(v.errors)
    )
