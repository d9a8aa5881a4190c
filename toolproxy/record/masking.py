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

Bodies are masked line by line in bounded memory, however they were cut, by the streaming JSON
lexer (toolproxy.record.jsonlexer), which hands every string it finds to the Masker here. A body
spilled to a temporary file is masked as it is read back, a megabyte at a time, into another
one. `extra.masked` counts exactly the replacements that were written. What the client receives
is never changed (only the record is).
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import hmac
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import re2

from toolproxy.record import keys
from toolproxy.record.jsonlexer import WINDOW_CHARS, Lines, Span, apply_spans, replace_spans
from toolproxy.record.model import Record
from toolproxy.record.spill import SpilledBody

KEY_FILE = "mask.key"

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
        MaskRule(
            "api-key",
            compile_pattern(
                r"\bBearer\s+[A-Za-z0-9._~+/=-]{16,}|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}|\bgh[pousr]_[A-Za-z0-9]{30,}"
                r"|\bAKIA[0-9A-Z]{16}\b|\bxox[abpr]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_-]{35}"
            ),
        ),
        MaskRule("credit-card", compile_pattern(r"\b\d(?:[ -]?\d){12,18}\b"), _card),
        MaskRule(
            "ipv4",
            compile_pattern(r"\b(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\b"),
        ),
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
            raise ValueError(
                f"--mask {spec!r}: not a built-in set ({', '.join(BUILTIN)}) and not a valid "
                f"regular expression for RE2 (linear-time: no backreferences or lookarounds): {reason}"
            ) from None
        if pattern.match("") is not None:
            raise ValueError(f"--mask {spec!r} matches the empty string; it would mask nothing useful")
        rules.append(MaskRule(spec, pattern))
    return rules


def load_key(data_dir: str | Path) -> bytes:
    """The data directory's masking key (record/keys.py)."""
    return keys.load_key(data_dir, KEY_FILE)


TOKEN_CACHE = 4096
_SURROGATE = re.compile("[\ud800-\udfff]")


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
            token = self._tokens[value] = (
                "masked:" + hmac.new(self.key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]
            )
        return token

    # ---- matching ----------------------------------------------------------------------------

    def spans(self, s: str) -> list[Span]:
        """Every accepted match in `s`, in order, none overlapping (an earlier rule wins)."""
        if self._any is None or not s or _search(self._any, s) is None:
            return []
        found: list[Span] = []
        for rule in self.rules:
            mine = [
                (start, end, self.token(s[start:end]), rule.name)
                for start, end in _finditer(rule.pattern, s)
                if start != end and (rule.accept is None or rule.accept(s[start:end]))
            ]
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
        out = apply_spans(s, spans) if spans else s
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
        return replace_spans(parts, spans) if spans else parts

    # ---- bodies ------------------------------------------------------------------------------

    def body(self, s: str, hits: Counter) -> str:
        """A recorded body held in memory: whole JSON, else line by line (NDJSON, SSE `data:`
        payloads, text)."""
        return "".join(self.stream([s], hits))

    def stream(self, texts: Iterable[str], hits: Counter) -> Iterator[str]:
        """A body arriving as consecutive texts (any cut), masked line by line in bounded memory."""
        lines = Lines(self, hits)
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
