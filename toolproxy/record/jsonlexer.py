"""The streaming JSON lexer masking reads bodies with: a body in any cut, masked line by line in
bounded memory, every string of it handed to the masker (toolproxy.record.masking).

Bodies are masked as the analyzer reads them, one line at a time: a JSON line (the whole body,
an NDJSON line, an SSE `data:` payload) up to LINE_CHARS is parsed, every string in it, object
keys included, is masked, and it is written back compactly, so a match can never break its
escaping and an escaped spelling (`\\u0040`) is matched as the text it stands for. A longer line,
or JSON nested deeper than the parser goes, is read as JSON text: each quoted string is decoded,
masked and, when something was replaced, encoded again, in windows of bounded size. Any other
line is masked as text. A stream delivers one text in many events (an e-mail address may arrive
as `jane.do` and `e@example.com`), so the pieces of each streamed output are joined before
matching and a match is cut back across them: the reassembled text reads exactly as if it had
been masked whole, and each event stays valid JSON.

Memory and time per body are bounded by those windows, not by the body: events wait for a
streamed output's continuation only up to HOLD_CHARS. A match is found across any two windows (or
events) when it is at most OVERLAP characters long; a longer one (no built-in pattern makes one)
is masked in pieces.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from toolproxy.record.masking import Masker

# A JSON line longer than this is read as JSON text in windows instead of being parsed whole.
LINE_CHARS = 256 * 1024
# Text is matched in windows of this many characters; a match up to OVERLAP long is found whole
# across two of them.
WINDOW_CHARS = 256 * 1024
OVERLAP = 4096
# Events held back while a streamed output they carry may still continue.
HOLD_CHARS = 1024 * 1024
# Keys whose string values a stack streams in pieces, one piece per event: the chat delta's
# `content` / `reasoning_content` / `refusal` / tool-call `arguments`, Responses' `delta`,
# Anthropic's `text` / `partial_json` / `thinking`, Ollama's `content` / `thinking` / `response`.
STREAMED_KEYS = frozenset(
    (
        "content",
        "text",
        "arguments",
        "partial_json",
        "thinking",
        "reasoning_content",
        "reasoning",
        "refusal",
        "response",
        "delta",
    )
)
# Fields of an event that say which output a piece belongs to (Responses, Anthropic).
_EVENT_IDS = ("index", "output_index", "content_index", "item_id")
# What may stand between the strings of a JSON text: anything else there is not JSON.
_JSON_BETWEEN = re.compile(r"(?:[\s\[\]{}:,0-9eE.+\-]|true|false|null)*")
# The body of a JSON string up to its closing quote or the end of what is at hand ("unrolled":
# no two ways to match the same text, so Python's re scans it in linear time).
_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*')

Span = tuple[int, int, str, str]  # start, end, token, rule name


def apply_spans(s: str, spans: list[Span]) -> str:
    out, pos = [], 0
    for start, end, token, _ in spans:
        out += [s[pos:start], token]
        pos = end
    out.append(s[pos:])
    return "".join(out)


def replace_spans(parts: list[str], spans: list[Span]) -> list[str]:
    """`parts` with each span of their concatenation replaced (see Masker.pieces)."""
    out = []
    j = 0
    offset = 0
    for part in parts:
        end = offset + len(part)
        pieces = []
        pos = offset
        while j < len(spans) and spans[j][0] < end:
            start, stop, token, _ = spans[j]
            if start >= pos:
                pieces += [part[pos - offset : start - offset], token]
            pos = max(pos, min(stop, end))
            if stop > end:
                break  # the match goes on into the next part
            j += 1
        pieces.append(part[pos - offset :])
        out.append("".join(pieces))
        offset = end
    return out


def _load(s: str) -> Any:
    try:
        return orjson.loads(s)
    except orjson.JSONDecodeError:
        return None


def _strings(root: list):
    """(container, key, path, is_key) of every string in a JSON value, object keys included. In
    the path a list element is named by its own `index` field when it has one (a streamed choice
    or tool call), else by its position, so the pieces of one output line up across events.
    Iterative: a body may nest as deep as the JSON parser allows, deeper than Python's recursion
    limit."""
    stack: list[tuple[Any, tuple]] = [(root, ())]
    while stack:
        value, path = stack.pop()
        nested = []
        is_dict = isinstance(value, dict)
        for key, item in value.items() if is_dict else enumerate(value):
            step = key
            if is_dict:
                yield value, key, (*path, key), True
            else:
                index = item.get("index") if isinstance(item, dict) else None
                step = ("#", index if isinstance(index, int) else key)
            if isinstance(item, str):
                yield value, key, (*path, step), False
            elif isinstance(item, (dict, list)):
                nested.append((item, (*path, step)))
        stack.extend(reversed(nested))


class _Line:
    """One line of a body on its way out: its text, or its parsed JSON while pieces of a
    streamed output in it wait to be settled."""

    __slots__ = ("text", "newline", "lead", "doc", "raw", "hits", "open", "changed", "renames")

    def __init__(self, text: str | None, newline: bool) -> None:
        self.text = text
        self.newline = newline  # the body goes on after it
        self.lead = ""
        self.doc: list | None = None
        self.raw = ""
        self.hits: Counter = Counter()
        self.open = 0  # pieces not yet settled
        self.changed = False
        self.renames: list[tuple[dict, str, str]] = []  # object keys to replace by their masked form


class _Channel:
    """The pieces of one streamed output not yet settled: (line, container, key) and their text."""

    __slots__ = ("refs", "texts", "fresh", "head")

    def __init__(self) -> None:
        self.refs: list[tuple[_Line, Any, Any]] = []
        self.texts: list[str] = []
        self.fresh = True  # got a piece since the last settling
        self.head = ""  # the start of a match settled before it ended (see Masker.spans_after)


class Lines:
    """A body cut into lines and masked; lines leave in order once nothing in them can change."""

    def __init__(self, masker: Masker, hits: Counter) -> None:
        self.m = masker
        self.hits = hits
        self.partial: list[str] = []
        self.partial_chars = 0
        self.long: _LongLine | None = None
        self.held: list[_Line] = []
        self.held_chars = 0
        self.channels: dict[Any, _Channel] = {}
        self.first = True

    def feed(self, text: str) -> Iterator[str]:
        pos = 0
        while pos < len(text):
            cut = text.find("\n", pos)
            piece = text[pos:] if cut < 0 else text[pos:cut]
            pos = len(text) if cut < 0 else cut + 1
            if self.long is not None:
                yield from self.long.feed(piece)
            else:
                self.partial.append(piece)
                self.partial_chars += len(piece)
                if self.partial_chars > LINE_CHARS:
                    yield from self._start_long()
            if cut >= 0:
                yield from self._end_line(newline=True)

    def finish(self) -> Iterator[str]:
        if self.long is not None or self.partial or self.first:
            yield from self._end_line(newline=False)
        yield from self._settle(final=True)

    def _start_long(self) -> Iterator[str]:
        yield from self._settle(final=True)  # a long line goes out as it is read: all before it first
        head = "".join(self.partial)
        self.partial, self.partial_chars = [], 0
        self.long = _LongLine(self.m, self.hits, head)
        yield from self.long.feed("")

    def _end_line(self, newline: bool) -> Iterator[str]:
        self.first = False
        if self.long is not None:  # everything before it has gone out already
            yield from self.long.finish()
            self.long = None
            if newline:
                yield "\n"
            return
        line = "".join(self.partial)
        self.partial, self.partial_chars = [], 0
        if not newline and not line:
            return
        self._add(line, newline)
        if self.held_chars > HOLD_CHARS:
            yield from self._settle(final=False)
        else:
            yield from self._emit()

    def _add(self, text: str, newline: bool) -> None:
        lead, payload = ("data:", text[5:]) if text.startswith("data:") else ("", text)
        doc = _load(payload) if payload.strip() else None
        if doc is None:
            if payload.strip():
                text = lead + _json_or_text(self.m, payload, self.hits)
            self.held.append(_Line(text, newline))
            self.held_chars += len(text)
            return
        line = _Line(None, newline)
        line.lead = lead + payload[: len(payload) - len(payload.lstrip(" "))]
        line.raw = text
        line.doc = [doc]
        ids = orjson.dumps([doc.get(k) for k in _EVENT_IDS], default=str) if isinstance(doc, dict) else b""
        for container, key, path, is_key in _strings(line.doc):
            if is_key:
                masked = self.m.text(key, line.hits)
                if masked != key:  # renamed once its values are settled: pieces are found by key
                    line.renames.append((container, key, masked))
                    line.changed = True
            elif path[-1] in STREAMED_KEYS:
                channel = self.channels.get((path, ids))
                if channel is None:
                    channel = self.channels[path, ids] = _Channel()
                channel.refs.append((line, container, key))
                channel.texts.append(container[key])
                channel.fresh = True
                line.open += 1
            else:
                masked = self.m.text(container[key], line.hits)
                if masked != container[key]:
                    container[key] = masked
                    line.changed = True
        self.held.append(line)
        self.held_chars += len(text)

    def _settle(self, final: bool) -> Iterator[str]:
        """Settle the channels' pieces (all of them when final; else all but each active
        channel's last OVERLAP characters), then send the lines that are complete."""
        for key in list(self.channels):
            channel = self.channels[key]
            if final or not channel.fresh:
                _settle_channel(self.m, channel, len(channel.texts))
                del self.channels[key]
            else:
                n = _keep_from(self.m, channel)
                if n == 0 and sum(len(t) for t in channel.texts) > HOLD_CHARS:
                    # One match has outgrown what may be held: settled so far, continued later.
                    _settle_channel(self.m, channel, len(channel.texts), keep_head=True)
                else:
                    _settle_channel(self.m, channel, n)
                channel.fresh = False
        yield from self._emit()

    def _emit(self) -> Iterator[str]:
        held = self.held
        n = 0
        while n < len(held) and held[n].open == 0:
            line = held[n]
            n += 1
            self.held_chars -= len(line.text if line.text is not None else line.raw)
            yield _finished(self.m, line, self.hits) + ("\n" if line.newline else "")
        del held[:n]
        if not held:
            self.held_chars = 0


def _rename(container: dict, old: str, new: str) -> None:
    """Key `old` of `container` renamed `new`, in its place (other keys keep their order)."""
    items = list(container.items())
    container.clear()
    for k, v in items:
        container[new if k == old else k] = v


def _keep_from(masker: Masker, channel: _Channel) -> int:
    """How many of an active channel's pieces can be settled now: those wholly before its last
    OVERLAP characters and before any match that might still grow into the next pieces."""
    total = sum(len(t) for t in channel.texts)
    cut = total - OVERLAP
    if cut <= 0:
        return 0
    for start, end, _, _ in masker.spans_after(channel.head, "".join(channel.texts)):
        if start < cut < end:
            cut = start
            break
    n, offset = 0, 0
    for text in channel.texts:
        if offset + len(text) > cut:
            break
        offset += len(text)
        n += 1
    return n


def _settle_channel(masker: Masker, channel: _Channel, n: int, keep_head: bool = False) -> None:
    """Mask the first `n` pieces of a channel as one text and put them in their lines. With
    `keep_head`, a match running to their end is taken to go on into the pieces after them."""
    if n == 0:
        return
    refs, texts = channel.refs[:n], channel.texts[:n]
    if n == 1 and not channel.head and not keep_head:  # one piece (a message's content): as any string
        line, container, key = refs[0]
        masked = masker.text(texts[0], line.hits)
        if masked != texts[0]:
            container[key] = masked
            line.changed = True
        line.open -= 1
        del channel.refs[:1], channel.texts[:1]
        return
    joined = "".join(texts)
    spans = masker.spans_after(channel.head, joined)
    head = ""
    if keep_head and spans and spans[-1][1] == len(joined):
        start = spans[-1][0]
        head = (channel.head + joined if start == 0 else joined[start:])[:OVERLAP]
    channel.head = head
    masked = replace_spans(texts, spans) if spans else texts
    # The token of each span counts for the line holding the piece where the span starts.
    bounds, offset = [], 0
    for text in texts:
        bounds.append(offset)
        offset += len(text)
    for start, _, _, rule in spans:
        refs[bisect.bisect_right(bounds, start) - 1][0].hits[rule] += 1
    for (line, container, key), old, new in zip(refs, texts, masked):
        if new != old:
            container[key] = new
            line.changed = True
        line.open -= 1
    del channel.refs[:n], channel.texts[:n]


def _finished(masker: Masker, line: _Line, hits: Counter) -> str:
    if line.text is not None:
        return line.text
    if line.changed:
        for container, old, new in reversed(line.renames):  # innermost first: keys of keys' objects
            _rename(container, old, new)
        try:
            text = line.lead + orjson.dumps(line.doc[0]).decode()
        except TypeError:  # nested deeper than orjson writes: the line read as JSON text instead
            own: Counter = Counter()
            text = _json_or_text(masker, line.raw, own, json=True)
            hits.update(own)
            return text
    else:
        text = line.raw
    hits.update(line.hits)
    return text


def _json_or_text(masker: Masker, text: str, hits: Counter, json: bool | None = None) -> str:
    """A line that could not be parsed: read as JSON text when it looks like JSON (or holds a
    backslash, which may be a JSON escape), else masked as text."""
    if json is None:
        body = text.lstrip()
        json = body[:1] in ("{", "[") or "\\" in text
    if not json:
        return masker.text(text, hits)
    long = _LongLine(masker, hits, "")
    return "".join([*long.feed(text), *long.finish()])


class _LongLine:
    """One line masked as JSON text as it arrives, in bounded memory: each quoted string decoded
    and masked (in windows when long), the text between strings masked as text unless it is what
    JSON has there. A line that does not start like JSON is masked as text in windows."""

    def __init__(self, masker: Masker, hits: Counter, head: str) -> None:
        self.m = masker
        self.hits = hits
        self.buf = head
        self.mode: str | None = None  # None: not yet known; "text"; "json"
        self.between = _Window(masker, hits)  # text between strings (or the whole line in text mode)
        self.string: _JsonString | None = None

    def feed(self, text: str) -> Iterator[str]:
        self.buf += text
        if self.mode is None:
            body = self.buf.lstrip()
            if not body:
                return
            lead = self.buf[5:].lstrip() if self.buf.startswith("data:") else body
            if not lead:
                return
            self.mode = "json" if lead[0] in '{["' or "\\" in self.buf else "text"
        if self.mode == "text":
            buf, self.buf = self.buf, ""
            yield from self.between.feed(buf)
            return
        yield from self._scan()

    def finish(self) -> Iterator[str]:
        if self.mode is None:
            self.mode = "text"
        if self.mode == "text":
            yield from self.between.feed(self.buf)
            self.buf = ""
            yield from self.between.finish()
            return
        yield from self._scan()
        if self.string is not None:  # never closed: not a JSON string after all
            yield from self.string.unclosed(self.buf, self.between)
            self.string, self.buf = None, ""
        elif self.buf:
            yield from self.between.feed(self.buf)
            self.buf = ""
        yield from self.between.finish()

    def _scan(self) -> Iterator[str]:
        buf, pos = self.buf, 0
        while pos < len(buf):
            if self.string is None:
                quote = buf.find('"', pos)
                if quote < 0:
                    yield from self._between(buf[pos:])
                    pos = len(buf)
                    break
                yield from self._between(buf[pos:quote])
                yield from self.between.finish()
                self.string = _JsonString(self.m, self.hits)
                pos = quote + 1
            m = _STRING_BODY.match(buf, pos)
            end = m.end()
            if end < len(buf) and buf[end] == '"':
                yield from self.string.close(buf[pos:end])
                self.string = None
                pos = end + 1
                continue
            # The string goes on; an unpaired backslash at the end (half an escape) stays in buf.
            yield from self.string.feed(buf[pos:end])
            pos = end
            break
        self.buf = buf[pos:]

    def _between(self, text: str) -> Iterator[str]:
        if not text:
            return
        if _JSON_BETWEEN.fullmatch(text):
            yield from self.between.flush_raw(text)
        else:
            yield from self.between.feed(text)


class _JsonString:
    """One JSON string of a long line: decoded, masked and encoded again when a match was found
    (else written as it was spelled). Kept whole up to WINDOW_CHARS; a longer one is decoded in
    windows, masked across them, and always encoded again (same value, JSON's own spelling)."""

    def __init__(self, masker: Masker, hits: Counter) -> None:
        self.m = masker
        self.hits = hits
        self.raw: list[str] = []
        self.raw_chars = 0
        self.window: _Window | None = None

    def feed(self, raw: str) -> Iterator[str]:
        self.raw.append(raw)
        self.raw_chars += len(raw)
        if self.raw_chars > WINDOW_CHARS:
            yield from self._decode_window(final=False)

    def close(self, raw: str) -> Iterator[str]:
        self.raw.append(raw)
        if self.window is None:
            whole = "".join(self.raw)
            value = _decode_string(whole)
            if value is None:  # not a JSON string after all: masked as the text it is
                yield from _Window(self.m, self.hits).once('"' + whole + '"')
                return
            masked = self.m.text(value, self.hits)
            yield '"' + whole + '"' if masked == value else orjson.dumps(masked).decode()
            return
        yield from self._decode_window(final=True)
        yield '"'

    def unclosed(self, rest: str, between: _Window) -> Iterator[str]:
        """The end of a line inside a string that never closed: masked as the text it is."""
        self.raw.append(rest)
        if self.window is None:
            yield from between.feed('"' + "".join(self.raw))
        else:
            yield from self._decode_window(final=True)

    def _decode_window(self, final: bool) -> Iterator[str]:
        raw = "".join(self.raw)
        keep = "" if final else _escape_tail(raw)
        raw = raw[: len(raw) - len(keep)]
        self.raw, self.raw_chars = [keep], len(keep)
        value = _decode_string(raw)
        if value is None:
            value = raw  # an escape JSON does not have: kept as written, masked as text
        if self.window is None:
            self.window = _Window(self.m, self.hits, encode=True)
            yield '"'
        yield from self.window.feed(value)
        if final:
            yield from self.window.finish()


def _escape_tail(raw: str) -> str:
    """The end of a JSON string's text that may be part of an escape cut by the window
    (`\\`, `\\u00`, the first half of a surrogate pair `\\ud83d`): kept for the next window."""
    cut = raw.rfind("\\", max(0, len(raw) - 12))
    return raw[cut:] if cut >= 0 else ""


def _decode_string(raw: str) -> str | None:
    try:
        value = orjson.loads('"' + raw + '"')
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


class _Window:
    """Text masked as it comes in windows of WINDOW_CHARS, OVERLAP characters of each kept for
    the next so that a match across the cut is found whole. `encode`: what leaves is JSON string
    content (orjson's escaping, without the quotes)."""

    def __init__(self, masker: Masker, hits: Counter, encode: bool = False) -> None:
        self.m = masker
        self.hits = hits
        self.encode = encode
        self.buf: list[str] = []
        self.chars = 0
        self.head = ""  # the start of a match masked before it ended (see Masker.spans_after)

    def feed(self, text: str) -> Iterator[str]:
        if text:
            self.buf.append(text)
            self.chars += len(text)
            if self.chars >= WINDOW_CHARS:
                yield from self._flush(final=False)

    def finish(self) -> Iterator[str]:
        if self.buf:
            yield from self._flush(final=True)

    def flush_raw(self, text: str) -> Iterator[str]:
        """Text that needs no masking, in its place after what is buffered."""
        yield from self.finish()
        yield text

    def once(self, text: str) -> Iterator[str]:
        yield from self.feed(text)
        yield from self.finish()

    def _flush(self, final: bool) -> Iterator[str]:
        text = "".join(self.buf)
        spans = self.m.spans_after(self.head, text)
        head = ""
        cut = len(text) if final else len(text) - OVERLAP
        for start, end, _, _ in spans:
            if start < cut < end:
                if start > 0:  # a match that may go on into the next window waits for it
                    cut = start
                else:  # one that has outgrown a window is masked so far, and its continuation next
                    cut = end
                    head = (self.head + text[:end])[:OVERLAP]
                break
        self.head = head
        done = [s for s in spans if s[1] <= cut]
        self.hits.update(rule for _, _, _, rule in done)
        out = apply_spans(text[:cut], done) if done else text[:cut]
        rest = text[cut:]
        self.buf, self.chars = ([rest], len(rest)) if rest else ([], 0)
        if out:
            yield orjson.dumps(out).decode()[1:-1] if self.encode else out
