"""The one shape every protocol is read into and written from.

A request is a system text, a message list, tools, a tool choice and the remaining parameters; a
reply is content, reasoning, calls, a finish reason, usage and an error. Messages and tools are
kept as chat-completions dicts (role/content/tool_calls/tool_call_id; `{"type": "function",
"function": {...}}`): that is the protocol the conditions rewrite and the analyzer hashes, so a
Responses or Messages exchange becomes the very conversation a chat harness would have sent.

Decoders produce events (a text delta, a call's start, an argument fragment, usage, the finish,
an error) in the order the wire carried them; `Reply.apply` folds them into the final message the
way a client library accumulates a stream. Events are plain slotted dataclasses, not frozen ones:
a stream makes hundreds, and a frozen dataclass pays an object.__setattr__ per field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(slots=True)
class Text:
    text: str


@dataclass(slots=True)
class Reasoning:
    text: str


@dataclass(slots=True)
class CallStart:
    """A call begins (or, seen again for the same index, learns its id or name)."""

    index: int
    id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class CallArguments:
    """An argument fragment (a string, concatenated in order) or the whole arguments object."""

    index: int
    delta: Any


@dataclass(slots=True)
class CallEnd:
    index: int


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass(slots=True)
class Finish:
    """The generation ended; `reason` in chat-completions words (stop, length, tool_calls, ...).

    `stop_type` is the stack's own word for why, where it says one: `eos` (the model's end token),
    `word` (a stop string matched; `stop_word` is which) or `limit` (llama.cpp `/completion`
    stop_type, SGLang `matched_stop`, Anthropic `stop_sequence`). A finish reason alone cannot
    tell an end token from a stop string: both are "stop".
    """

    reason: str | None
    stop_type: str | None = None
    stop_word: str | None = None


@dataclass(slots=True)
class Error:
    message: str


Event = Text | Reasoning | CallStart | CallArguments | CallEnd | Usage | Finish | Error


@dataclass(slots=True)
class Call:
    index: int
    id: str | None = None
    name: str | None = None
    # A JSON string as OpenAI sends it, or an object as Ollama native (and some llama.cpp builds) do.
    arguments: Any = None

    def arguments_text(self) -> str:
        """The arguments as a JSON text, whatever form they arrived in."""
        if self.arguments is None:
            return "{}"
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(self.arguments).decode()

    def arguments_object(self) -> Any:
        """The arguments as an object; the raw text when it is not JSON."""
        if not isinstance(self.arguments, str):
            return {} if self.arguments is None else self.arguments
        try:
            return orjson.loads(self.arguments) if self.arguments.strip() else {}
        except orjson.JSONDecodeError:
            return self.arguments


@dataclass(slots=True, eq=False)
class Reply:
    streamed: bool = False
    tool_calls: list[Call] = field(default_factory=list)
    finish_reason: str | None = None
    n_choices: int = 0
    complete: bool = False
    error: str | None = None
    model: str | None = None
    # The reply's own id (chatcmpl-..., resp_..., msg_...): a Responses id is what a later
    # request names as its previous_response_id.
    id: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # Finish.stop_type and stop_word: why the stack says generation stopped, where it says so.
    stop_type: str | None = None
    stop_word: str | None = None
    # Why the body could not be read at all (not JSON, unknown encoding, ...); None if it could.
    unreadable: str | None = None
    # The start of an unreadable body, so a plain-text error page can still be read and judged.
    raw_text: str | None = None
    empty_body: bool = False
    # At least one object of the protocol's reply shape was read (not only errors or noise).
    decoded: bool = False
    # First and last JSON objects seen: what stack-marker detection looks at.
    first: dict | None = None
    last: dict | None = None
    # Text and reasoning arrive in pieces; they are joined when read, so a stream of many small
    # deltas costs linear time, not a copy of everything so far per delta.
    _content: list[str] = field(default_factory=list, repr=False)
    _reasoning: list[str] = field(default_factory=list, repr=False)
    # Argument fragments not yet joined onto their call (see settle).
    _fragments: dict[int, list[str]] = field(default_factory=dict, repr=False)

    @property
    def content(self) -> str | None:
        return _joined(self._content)

    @content.setter
    def content(self, value: str | None) -> None:
        self._content = [] if value is None else [value]

    @property
    def reasoning_content(self) -> str | None:
        return _joined(self._reasoning)

    @reasoning_content.setter
    def reasoning_content(self, value: str | None) -> None:
        self._reasoning = [] if value is None else [value]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Reply):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in _COMPARED)

    @property
    def has_output(self) -> bool:
        # not isspace() is not strip() without copying the text (both use Unicode whitespace)
        return (
            bool(self.tool_calls)
            or bool(self.content and not self.content.isspace())
            or bool(self.reasoning_content and not self.reasoning_content.isspace())
        )

    @property
    def usage(self) -> dict | None:
        """Usage in chat-completions words, or None when the stack reported none."""
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        p, c = self.prompt_tokens or 0, self.completion_tokens or 0
        out: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        if self.cached_tokens is not None:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return out

    def _text(self, event: Text) -> None:
        self._content.append(event.text)

    def _reasoning_part(self, event: Reasoning) -> None:
        self._reasoning.append(event.text)

    def _call_start(self, event: CallStart) -> None:
        call = self._call(event.index)
        call.id = call.id or event.id
        call.name = call.name or event.name

    def _call_arguments(self, event: CallArguments) -> None:
        call = self._call(event.index)
        if isinstance(event.delta, str):
            if call.arguments is None or isinstance(call.arguments, str):
                parts = self._fragments.get(event.index)
                if parts is None:
                    self._fragments[event.index] = [event.delta]
                else:
                    parts.append(event.delta)
        elif event.delta is not None:
            call.arguments = event.delta
            self._fragments.pop(event.index, None)

    def _usage(self, event: Usage) -> None:
        if event.prompt_tokens is not None:
            self.prompt_tokens = event.prompt_tokens
        if event.completion_tokens is not None:
            self.completion_tokens = event.completion_tokens
        if event.cached_tokens is not None:
            self.cached_tokens = event.cached_tokens

    def _finish(self, event: Finish) -> None:
        self.finish_reason = event.reason or self.finish_reason
        self.stop_type = event.stop_type or self.stop_type
        self.stop_word = event.stop_word or self.stop_word
        self.complete = True

    def _error(self, event: Error) -> None:
        self.error = event.message

    def _call_end(self, event: CallEnd) -> None:
        """A call's end changes nothing in the message: its parts are all in."""

    def settle(self) -> None:
        """Join argument fragments onto their calls: once per batch of events, not per fragment,
        so arguments streamed in thousands of pieces cost linear time."""
        if not self._fragments:
            return
        for index, parts in self._fragments.items():
            call = self._call(index)
            call.arguments = (call.arguments if isinstance(call.arguments, str) else "") + "".join(parts)
        self._fragments.clear()

    def _call(self, index: int) -> Call:
        for call in self.tool_calls:
            if call.index == index:
                return call
        call = Call(index)
        calls = self.tool_calls
        calls.append(call)
        if len(calls) > 1 and calls[-2].index > index:  # calls mostly arrive in order: no sort then
            calls.sort(key=lambda c: c.index)
        return call


# How each event folds into a Reply, by its type: one lookup instead of a chain of isinstance
# tests, and the decoder folds the events it makes without a call to apply in between.
FOLD = {
    Text: Reply._text,
    Reasoning: Reply._reasoning_part,
    CallStart: Reply._call_start,
    CallArguments: Reply._call_arguments,
    CallEnd: Reply._call_end,
    Usage: Reply._usage,
    Finish: Reply._finish,
    Error: Reply._error,
}


def _joined(parts: list[str]) -> str | None:
    if not parts:
        return None
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0]


_COMPARED = ("content", "reasoning_content", *(f for f in Reply.__dataclass_fields__ if not f.startswith("_")))


@dataclass(slots=True)
class Request:
    """A request in chat-completions terms (see the module docstring); `body` is the original."""

    family: str
    messages: list[Any]
    tools: list[dict] = field(default_factory=list)
    tool_choice: Any = None
    stream: bool = False
    model: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def system(self) -> str | None:
        """The leading system (or developer) text, if the conversation has one."""
        first = self.messages[0] if self.messages else None
        if isinstance(first, dict) and first.get("role") in ("system", "developer"):
            return text_of(first.get("content"))
        return None


def leading_system(messages: list[Any]) -> tuple[str | None, list[Any]]:
    """(the leading system or developer text, the other messages): Responses and Messages carry
    it in a field of its own (`instructions`, `system`)."""
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        return text_of(first.get("content")), list(messages[1:])
    return None, list(messages)


class BufferingEncoder:
    """The text half every encoder shares: each delta is written at once when streaming, and all
    of it is kept for the final body (the whole reply when not streaming, the closing events when
    streaming)."""

    content_type: str

    def __init__(self, *, model: str, stream: bool) -> None:
        self.model = model
        self.stream = stream
        self._text: list[str] = []

    def delta(self, text: str) -> bytes:
        if not text:
            return b""
        self._text.append(text)
        return self._stream_delta(text) if self.stream else b""

    def _stream_delta(self, text: str) -> bytes:
        raise NotImplementedError


def message_calls(msg: dict) -> list[dict]:
    """A chat message's tool_calls entries that are objects: the history is the harness's, so a
    list of numbers or a string there is skipped, never a crash in a writer."""
    calls = msg.get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def text_of(content: Any) -> str:
    """Plain text of a message content: a string, or content parts / blocks (their text joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"]
            for p in content
            if isinstance(p, dict)
            and isinstance(p.get("text"), str)
            and p.get("type") in ("text", "input_text", "output_text")
        )
    return str(content)
