"""The response half of a rewriting condition: upstream text in, a standard reply out.

ReplyTransform wires three parts together: a wire Decoder for the protocol the condition sent to
(text deltas as they arrive, then finish, usage and any error), an interpreter (decides which
text is safe to show now and what the calls are at the end) and a wire encoder for the protocol
the client spoke (chat, Ollama, Responses, Messages), so the harness gets native calls in its
own protocol. Anything but a 2xx from upstream passes through byte for byte: a refusal must reach
the harness, and the record, exactly as the stack sent it. A keep-alive comment from the stack is
passed on as one to a client that streams SSE, so a slow prompt does not look like a dead one.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from typing import Protocol

from toolproxy.wire import Call, Decoder, Text
from toolproxy.wire.hopbyhop import NOT_FORWARDED_DOWN


def new_call(name: str, arguments: str) -> Call:
    """A call the proxy found in text, with a fresh id as a server would give it."""
    return Call(0, "call_" + secrets.token_hex(12), name, arguments)


class Encoder(Protocol):
    content_type: str

    def delta(self, text: str) -> bytes: ...

    def end(self, tail: str, calls: list[Call], finish_reason: str | None, usage: dict | None) -> bytes: ...

    def error(self, message: str) -> bytes: ...


class Interpreter(Protocol):
    note: str | None

    def feed(self, text: str) -> str:
        """The part of the text so far that can be shown to the client now."""

    def finish(self) -> tuple[str, list[Call]]:
        """(content not yet shown, calls) once the reply is complete."""


def text_calls(
    text: str, *, tool_names: tuple[str, ...] | None, formats: tuple[str, ...] | None
) -> tuple[str, list[Call]]:
    """Calls in a reply via toolproxy.calls.parse_text, and the content around them.

    Only calls with a name and an arguments object become tool_calls; a call that was attempted
    but cannot be recovered stays in the content as the model wrote it, so the harness sees the
    reply rather than an error (and the analyzer can still classify it as unparseable).
    """
    from toolproxy.calls import parse_text

    parsed = parse_text(text, tool_names=tool_names, formats=formats)  # never raises, by contract
    calls: list[Call] = []
    kept: list[str] = []
    pos = 0
    for call in sorted(parsed.calls, key=lambda c: c.span[0]):
        if call.name and isinstance(call.arguments, dict) and call.error is None:
            start, end = call.span
            if start < pos:
                continue  # a second call inside a span already removed (a parallel-call wrapper)
            kept.append(text[pos:start])
            pos = end
            calls.append(new_call(call.name, json.dumps(call.arguments, ensure_ascii=False)))
    kept.append(text[pos:])
    if not calls:
        return text, []
    if len(calls) == len(parsed.calls):
        return parsed.content, calls
    return "".join(kept).strip(), calls


class CallScanner:
    """Streams prose live, holds back from the first call marker, parses the held part at the end."""

    def __init__(self, parse: Callable[[str], tuple[str, list[Call]]], markers: tuple[str, ...]) -> None:
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
        rest = self.text[self.shown :]
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

    def finish(self) -> tuple[str, list[Call]]:
        rest = self.text[self.shown :]
        if not rest:
            self.note = "no call marker in the reply"
            return "", []
        content, calls = self.parse(rest)
        self.note = (
            f"{len(calls)} call(s) parsed from the reply" if calls else "call syntax held back but no call recovered"
        )
        if calls and self.shown and content:
            content = "\n" + content  # the text around the call was trimmed; keep it apart from the prose
        return content, calls


KEEPALIVE = b": keep-alive\n\n"


def _keepalive(chunk: bytes) -> bool:
    """The chunk holds an SSE comment line (llama-server's keep-alive while it reads a prompt)."""
    return chunk[:1] == b":" or b"\n:" in chunk


class ReplyTransform:
    def __init__(self, decoder: Decoder, interpreter: Interpreter, emitter: Encoder) -> None:
        self.decoder = decoder
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
        self.decoder.content_type = headers.get("Content-Type") or headers.get("content-type")
        out = [("Content-Type", self.emitter.content_type)]
        if self.emitter.content_type == "text/event-stream":
            out.append(("Cache-Control", "no-cache"))
        return 200, out

    def _show(self, events: list) -> bytes:
        return b"".join(self.emitter.delta(self.interpreter.feed(e.text)) for e in events if isinstance(e, Text))

    def feed(self, chunk: bytes) -> bytes:
        if self.passthrough:
            return chunk
        shown = self._show(self.decoder.feed(chunk))
        if not shown and self.emitter.content_type == "text/event-stream" and _keepalive(chunk):
            # The stack is still reading a long prompt and says so with SSE comments: the client
            # hears it too, or its own idle timer (undici's 300 s, Claude Code's, Codex's) gives up
            # on a response that is only slow.
            return KEEPALIVE
        return shown

    def finish(self) -> bytes:
        if self.passthrough:
            return b""
        shown = self._show(self.decoder.close())
        reply = self.decoder.reply
        if reply.error is not None:
            # An error inside a 200 (a stream that broke, a flat error object): the harness must
            # see it as an error, not as a reply that simply ended.
            self.note = f"upstream sent an error event: {reply.error}"
            return shown + self.emitter.error(reply.error)
        if not reply.decoded and reply.unreadable is not None:
            self.note = f"upstream reply could not be read: {reply.unreadable}"
            return shown + self.emitter.error(f"upstream reply could not be read: {reply.unreadable}")
        tail, calls = self.interpreter.finish()
        self.note = self.interpreter.note
        # Calls the stack returned natively (it parsed them despite the rewrite) are kept, first.
        native = [new_call(c.name, c.arguments_text()) for c in reply.tool_calls if c.name]
        return shown + self.emitter.end(tail, native + calls, reply.finish_reason, reply.usage)
