"""`--mask`: personal data and secrets in message text replaced before a record reaches disk.

Header redaction never sees what agents put in bodies: pasted files, tool results, e-mail
addresses, keys. Each match becomes `masked:<8 hex>`, an HMAC-SHA256 of the matched text under a
key kept in the data directory (`mask.key`, created 0600): the same value masks the same way
everywhere, so analysis can still group by it, but a guess cannot be checked against the data
without the key. Delete the key file and new masks no longer match old ones.

Patterns run on RE2 (google-re2), built-in and user-given alike: an automaton, so a search takes
time linear in the text whatever the pattern and the input (Python's backtracking `re` took 2.8 s
on a 40 KB run of address characters with no `@`, quadratically more on longer ones), and it
lets go of the GIL while it scans, so the event loop is never held up by a long text. A pattern
RE2 cannot run (a backreference, a lookaround) is refused at start. Where two rules match
overlapping text, the earlier rule's match is kept.

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

Memory and time per body are bounded by those windows, not by the body: a body spilled to a
temporary file is masked as it is read back, a megabyte at a time, into another one, and events
wait for a streamed output's continuation only up to HOLD_CHARS. A match is found across any two
windows (or events) when it is at most OVERLAP characters long; a longer one (no built-in
pattern makes one) is masked in pieces. `extra.masked` counts exactly the replacements that were
written. What the client receives is never changed (only the record is).
"""

from __future__ import annotations

import bisect
import codecs
import dataclasses
import hashlib
import hmac
import re
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import orjson
import re2

from toolproxy.record import keys
from toolproxy.record.model import Record
from toolproxy.record.spill import SpilledBody

KEY_FILE = "mask.key"

# A JSON line longer than this is read as JSON text in windows instead of being parsed whole.
LINE_CHARS = 256 * 1024
# Text is matched in windows of this many characters; a match up to OVERLAP long is found whole
# across two of them.
WINDOW_CHARS = 256 * 1024
OVERLAP = 4096
# Events held back while a streamed output they carry may still continue.
HOLD_CHARS = 1024 * 1024
# Strings at least this long are remembered with their masked form (an agent resends its whole
# history every turn), up to CACHE_CHARS characters in all.
CACHE_MIN_CHARS = 64
CACHE_MAX_CHARS = 64 * 1024
CACHE_CHARS = 8 * 1024 * 1024


def luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(match: str) -> bool:
    digits = match.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and digits.isascii() and digits.isdigit() and luhn(digits)


_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print its parse errors to stderr itself


def compile_pattern(pattern: str):
    return re2.compile(pattern, _OPTIONS)


@dataclass(frozen=True)
class MaskRule:
    name: str
    pattern: Any  # a compiled RE2 pattern
    accept: Callable[[str], bool] | None = None


BUILTIN: dict[str, MaskRule] = {
    r.name: r
    for r in (
        MaskRule("email", compile_pattern(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
        MaskRule("api-key", compile_pattern(
            r"\bBearer\s+[A-Za-z0-9._~+/=-]{16,}|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}|\bgh[pousr]_[A-Za-z0-9]{30,}"
            r"|\bAKIA[0-9A-Z]{16}\b|\bxox[abpr]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_-]{35}")),
        MaskRule("credit-card", compile_pattern(r"\b\d(?:[ -]?\d){12,18}\b"), _card),
        MaskRule("ipv4", compile_pattern(r"\b(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\b")),
    )
}


def parse_rules(specs: tuple[str, ...] | list[str]) -> list[MaskRule]:
    """Built-in names or regular expressions (RE2 syntax). ValueError naming the bad one."""
    rules = []
    for spec in specs:
        if spec in BUILTIN:
            rules.append(BUILTIN[spec])
            continue
        try:
            pattern = compile_pattern(spec)
        except re2.error as exc:
            reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
            raise ValueError(f"--mask {spec!r}: not a built-in set ({', '.join(BUILTIN)}) and not a valid "
                             f"regular expression for RE2 (linear-time: no backreferences or lookarounds): {reason}") from None
        if pattern.match("") is not None:
            raise ValueError(f"--mask {spec!r} matches the empty string; it would mask nothing useful")
        rules.append(MaskRule(spec, pattern))
    return rules


def load_key(data_dir: str | Path) -> bytes:
    """The data directory's masking key (record/keys.py)."""
    return keys.load_key(data_dir, KEY_FILE)


# Keys whose string values a stack streams in pieces, one piece per event: the chat delta's
# `content` / `reasoning_content` / `refusal` / tool-call `arguments`, Responses' `delta`,
# Anthropic's `text` / `partial_json` / `thinking`, Ollama's `content` / `thinking` / `response`.
STREAMED_KEYS = frozenset(("content", "text", "arguments", "partial_json", "thinking", "reasoning_content",
                           "reasoning", "refusal", "response", "delta"))
TOKEN_CACHE = 4096
# Fields of an event that say which output a piece belongs to (Responses, Anthropic).
_EVENT_IDS = ("index", "output_index", "content_index", "item_id")
_SURROGATE = re.compile("[\ud800-\udfff]")
# What may stand between the strings of a JSON text: anything else there is not JSON.
_JSON_BETWEEN = re.compile(r"(?:[\s\[\]{}:,0-9eE.+\-]|true|false|null)*")
# The body of a JSON string up to its closing quote or the end of what is at hand ("unrolled":
# no two ways to match the same text, so Python's re scans it in linear time).
_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*')

Span = tuple[int, int, str, str]  # start, end, token, rule name


class Stopped(Exception):
    """Masking was told to stop (`Masker.stop`, set at shutdown) in the middle of a spilled body."""


class Masker:
    def __init__(self, rules: list[MaskRule], key: bytes) -> None:
        self.rules = rules
        self.key = key
        # Set at shutdown: a spilled body being masked stops at its next window (Stopped).
        self.stop: threading.Event | None = None
        self._tokens: dict[str, str] = {}
        # One search for "could any rule match here?": most strings match none, and one RE2
        # call is far cheaper than one per rule.
        self._any = _any_of(rules)
        self._cache: OrderedDict[str, tuple[str, Counter]] = OrderedDict()
        self._cache_chars = 0

    def token(self, value: str) -> str:
        # Remembered: an agent resends its whole history every turn, so the same values recur.
        token = self._tokens.get(value)
        if token is None:
            if len(self._tokens) >= TOKEN_CACHE:
                self._tokens.clear()
            token = self._tokens[value] = "masked:" + hmac.new(
                self.key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]
        return token

    # ---- matching ----------------------------------------------------------------------------

    def spans(self, s: str) -> list[Span]:
        """Every accepted match in `s`, in order, none overlapping (an earlier rule wins)."""
        if self._any is None or not s or _search(self._any, s) is None:
            return []
        found: list[Span] = []
        for rule in self.rules:
            mine = [(start, end, self.token(s[start:end]), rule.name) for start, end in _finditer(rule.pattern, s)
                    if start != end and (rule.accept is None or rule.accept(s[start:end]))]
            found = _merge(found, mine) if found else mine
        return found

    def spans_after(self, head: str, s: str) -> list[Span]:
        """The spans of `s` read as going on from `head`, the start of a match masked earlier up
        to where `s` begins because it outgrew a window: its continuation in `s` is a span too."""
        if not head:
            return self.spans(s)
        out = []
        for start, end, token, rule in self.spans(head + s):
            if end > len(head):
                start, end = max(start - len(head), 0), end - len(head)
                out.append((start, end, self.token(s[start:end]) if start == 0 else token, rule))
        return out

    def text(self, s: str, hits: Counter) -> str:
        """`s` masked whole (held in memory: for strings and lines of bounded size)."""
        cacheable = CACHE_MIN_CHARS <= len(s) <= CACHE_MAX_CHARS
        cached = self._cache.get(s) if cacheable else None
        if cached is not None:
            self._cache.move_to_end(s)
            hits.update(cached[1])
            return cached[0]
        spans = self.spans(s)
        own: Counter = Counter(rule for _, _, _, rule in spans)
        out = _apply(s, spans) if spans else s
        if cacheable:
            self._remember(s, out, own)
        hits.update(own)
        return out

    def _remember(self, s: str, out: str, own: Counter) -> None:
        self._cache[s] = (out, own)
        self._cache_chars += len(s)
        while self._cache_chars > CACHE_CHARS:
            old, _ = self._cache.popitem(last=False)
            self._cache_chars -= len(old)

    def pieces(self, parts: list[str], hits: Counter) -> list[str]:
        """Text that arrived in pieces, masked as the one text it is: a match spanning pieces
        becomes one token, in the piece where the match starts; the pieces after it lose the
        matched characters they held. Joined, the result is the text masked whole."""
        spans = self.spans("".join(parts))
        hits.update(rule for _, _, _, rule in spans)
        return _replace(parts, spans) if spans else parts

    # ---- bodies ------------------------------------------------------------------------------

    def body(self, s: str, hits: Counter) -> str:
        """A recorded body held in memory: whole JSON, else line by line (NDJSON, SSE `data:`
        payloads, text)."""
        return "".join(self.stream([s], hits))

    def stream(self, texts: Iterable[str], hits: Counter) -> Iterator[str]:
        """A body arriving as consecutive texts (any cut), masked line by line in bounded memory."""
        lines = _Lines(self, hits)
        for text in texts:
            yield from lines.feed(text)
        yield from lines.finish()

    def record(self, rec: Record) -> Record:
        """A copy of the record with its text bodies masked and extra["masked"] counting the
        replacements per rule; the record itself (which the proxy may still read) is left as it
        is. A spilled body is masked from its file into another one, never read whole. Bodies
        that are not UTF-8 text (stored base64: binary, or compressed with Content-Encoding) are
        not masked and are listed in extra["unmasked"]."""
        hits: Counter = Counter()
        changes: dict[str, Any] = {}
        unmasked = []
        for field in ("request_body", "response_body", "client_body"):
            value = getattr(rec, field)
            if value is None:
                continue
            if isinstance(value, SpilledBody):
                value.ready.result()
                if not value.utf8:
                    unmasked.append(field)
                    continue
                changes[field] = self.spilled(value, hits)
                changes[f"{field}_encoding"] = "utf8"
                continue
            if getattr(rec, f"{field}_encoding") == "base64":
                unmasked.append(field)
                continue
            masked = self.body(value, hits)
            if masked != value:
                changes[field] = masked
        up = rec.upstream_request
        if up is not None and isinstance(up.get("body"), str):
            if up.get("body_encoding") != "base64":
                masked = self.body(up["body"], hits)
                if masked != up["body"]:
                    changes["upstream_request"] = {**up, "body": masked}
            else:
                unmasked.append("upstream_request")
        extra = {**rec.extra, "masked": dict(hits)}
        if unmasked:
            extra["unmasked"] = unmasked
        return dataclasses.replace(rec, **changes, extra=extra)

    def spilled(self, body: SpilledBody, hits: Counter) -> SpilledBody:
        """A spilled UTF-8 body masked into a new spilled body, a piece at a time."""
        decoder = codecs.getincrementaldecoder("utf-8")()
        out = SpilledBody(body.directory)
        pending: list[str] = []
        size = 0
        texts = (decoder.decode(piece) for piece in body.chunks())
        for text in self.stream(texts, hits):
            if self.stop is not None and self.stop.is_set():
                raise Stopped
            pending.append(text)
            size += len(text)
            if size >= WINDOW_CHARS:
                out.append("".join(pending).encode("utf-8"))
                pending, size = [], 0
        if pending:
            out.append("".join(pending).encode("utf-8"))
        out.seal()
        return out


def _merge(kept: list[Span], new: list[Span]) -> list[Span]:
    """Both lists of spans in order, less the new ones that overlap a kept one (one pass)."""
    out: list[Span] = []
    i = 0
    for span in new:
        while i < len(kept) and kept[i][1] <= span[0]:
            out.append(kept[i])
            i += 1
        if i < len(kept) and kept[i][0] < span[1]:
            continue  # an earlier rule already masks part of it
        out.append(span)
    out.extend(kept[i:])
    return out


def _any_of(rules: list[MaskRule]):
    """One pattern matching where any rule's does; None when there is nothing to match. Patterns
    that cannot be joined (two name one group alike) give one that always matches, so every rule
    is run."""
    if not rules:
        return None
    try:
        return compile_pattern("|".join(f"(?:{r.pattern.pattern})" for r in rules))
    except re2.error:
        return compile_pattern("")


def _search(pattern, s: str):
    try:
        return pattern.search(s)
    except UnicodeEncodeError:  # a lone surrogate: RE2 reads UTF-8, so search around it
        return next(iter(_finditer(pattern, s)), None)


def _finditer(pattern, s: str) -> Iterator[tuple[int, int]]:
    try:
        encoded_ok = s.isascii() or s.encode("utf-8") is not None
    except UnicodeEncodeError:
        encoded_ok = False
    if encoded_ok:
        for m in pattern.finditer(s):
            yield m.span()
        return
    start = 0
    for cut in [m.start() for m in _SURROGATE.finditer(s)] + [len(s)]:
        for m in pattern.finditer(s[start:cut]):
            yield m.start() + start, m.end() + start
        start = cut + 1


def _apply(s: str, spans: list[Span]) -> str:
    out, pos = [], 0
    for start, end, token, _ in spans:
        out += [s[pos:start], token]
        pos = end
    out.append(s[pos:])
    return "".join(out)


def _replace(parts: list[str], spans: list[Span]) -> list[str]:
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
                pieces += [part[pos - offset:start - offset], token]
            pos = max(pos, min(stop, end))
            if stop > end:
                break  # the match goes on into the next part
            j += 1
        pieces.append(part[pos - offset:])
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


class _Lines:
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
    masked = _replace(texts, spans) if spans else texts
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
            self.mode = "json" if lead[0] in "{[\"" or "\\" in self.buf else "text"
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
        out = _apply(text[:cut], done) if done else text[:cut]
        rest = text[cut:]
        self.buf, self.chars = ([rest], len(rest)) if rest else ([], 0)
        if out:
            yield orjson.dumps(out).decode()[1:-1] if self.encode else out
