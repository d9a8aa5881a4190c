"""The response half of a rewriting condition: upstream text in, a standard chat response out.

ReplyTransform wires three parts together: an UpstreamReader (text deltas from whatever API the
condition called), an interpreter (decides which text is safe to show now and what the calls
are at the end) and an Emitter (the client's dialect). Anything but a 2xx from upstream passes
through byte for byte: a refusal must reach the harness, and the record, exactly as the stack
sent it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Protocol

from toolproxy.conditions.synth import Emitter, ToolCall
from toolproxy.conditions.upstream import UpstreamReader
from toolproxy.proxy.headers import NOT_FORWARDED_DOWN

# Where call syntax can begin, per parse_text format family: prose before the first marker is
# streamed as it arrives, everything from a marker on is held until the reply is complete.
MARKERS = {
    "hermes": ("<tool_call",),
    "qwen_xml": ("<tool_call", "<function="),
    "llama_json": ("{",),
    "python_tag": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]",),
    "pythonic": ("[", "<function_calls>"),
    "functiongemma": ("<start_function_call>",),
    "lmstudio": ("[TOOL_REQUEST]",),
    "fenced_json": ("```",),
    "bare_json": ("{",),
}


def markers_for(formats: tuple[str, ...] | None) -> tuple[str, ...]:
    chosen = MARKERS if formats is None else {f: MARKERS[f] for f in formats if f in MARKERS}
    return tuple(sorted({m for ms in chosen.values() for m in ms}))


class Interpreter(Protocol):
    note: str | None

    def feed(self, text: str) -> str:
        """The part of the text so far that can be shown to the client now."""

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not yet shown, calls) once the reply is complete."""


def text_calls(text: str, *, tool_names: tuple[str, ...] | None, formats: tuple[str, ...] | None) -> tuple[str, list[ToolCall]]:
    """Calls in a reply via toolproxy.calls.parse_text, and the content around them.

    Only calls with a name and an arguments object become tool_calls; a call that was attempted
    but cannot be recovered stays in the content as the model wrote it, so the harness sees the
    reply rather than an error (and the analyzer can still classify it as unparseable).
    """
    from toolproxy.calls import parse_text

    parsed = parse_text(text, tool_names=tool_names, formats=formats)  # never raises, by contract
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    for call in sorted(parsed.calls, key=lambda c: c.span[0]):
        if call.name and isinstance(call.arguments, dict) and call.error is None:
            start, end = call.span
            if start < pos:
                continue  # a second call inside a span already removed (a parallel-call wrapper)
            kept.append(text[pos:start])
            pos = end
            calls.append(ToolCall(call.name, json.dumps(call.arguments, ensure_ascii=False)))
    kept.append(text[pos:])
    if not calls:
        return text, []
    if len(calls) == len(parsed.calls):
        return parsed.content, calls
    return "".join(kept).strip(), calls


class CallScanner:
    """Streams prose live, holds back from the first call marker, parses the held part at the end."""

    def __init__(self, parse: Callable[[str], tuple[str, list[ToolCall]]], markers: tuple[str, ...]) -> None:
        self.parse = parse
        self.markers = markers
        self.text = ""
        self.shown = 0
        self.held = False
        self.note: str | None = None

    def feed(self, text: str) -> str:
        self.text += text
        if self.held:
            return ""
        rest = self.text[self.shown:]
        hits = [i for i in (rest.find(m) for m in self.markers) if i >= 0]
        if hits:
            self.held = True
            safe = min(hits)
        else:
            safe = len(rest) - self._partial_marker(rest)
        self.shown += safe
        return rest[:safe]

    def _partial_marker(self, rest: str) -> int:
        """Length of the longest tail of `rest` that could be the start of a marker."""
        longest = 0
        for m in self.markers:
            for n in range(min(len(m) - 1, len(rest)), longest, -1):
                if rest.endswith(m[:n]):
                    longest = n
                    break
        return longest

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest = self.text[self.shown:]
        if not rest:
            self.note = "no call marker in the reply"
            return "", []
        content, calls = self.parse(rest)
        self.note = f"{len(calls)} call(s) parsed from the reply" if calls else "call syntax held back but no call recovered"
        if calls and self.shown and content:
            content = "\n" + content  # the text around the call was trimmed; keep it apart from the prose
        return content, calls


class ReplyTransform:
    def __init__(self, reader: UpstreamReader, interpreter: Interpreter, emitter: Emitter) -> None:
        self.reader = reader
        self.interpreter = interpreter
        self.emitter = emitter
        self.passthrough = False
        self.note: str | None = None

    def start(self, status: int, headers: Mapping[str, str]) -> tuple[int, list[tuple[str, str]]]:
        if not 200 <= status < 300:
            self.passthrough = True
            self.note = f"upstream answered {status}: passed through unchanged"
            drop = NOT_FORWARDED_DOWN | {"content-length"}
            return status, [(k, v) for k, v in headers.items() if k.lower() not in drop]
        out = [("Content-Type", self.emitter.content_type)]
        if self.emitter.content_type == "text/event-stream":
            out.append(("Cache-Control", "no-cache"))
        return 200, out

    def _show(self, texts: list[str]) -> bytes:
        return b"".join(self.emitter.delta(self.interpreter.feed(t)) for t in texts)

    def feed(self, chunk: bytes) -> bytes:
        if self.passthrough:
            return chunk
        return self._show(self.reader.feed(chunk))

    def finish(self) -> bytes:
        if self.passthrough:
            return b""
        shown = self._show(self.reader.close())
        if self.reader.error and not self.reader.decoded:
            self.note = f"upstream sent an error event: {self.reader.error}"
            return shown + self.emitter.error(self.reader.error)
        tail, calls = self.interpreter.finish()
        self.note = self.interpreter.note
        return shown + self.emitter.end(tail, calls, self.reader.finish_reason, self.reader.usage)


def tool_names_of(functions: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(fn["name"] for fn in functions)
