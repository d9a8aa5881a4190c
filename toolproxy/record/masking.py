"""`--mask`: personal data and secrets in message text replaced before a record reaches disk.

Header redaction never sees what agents put in bodies: pasted files, tool results, e-mail
addresses, keys. Each match becomes `masked:<8 hex>`, an HMAC-SHA256 of the matched text under a
key kept in the data directory (`mask.key`, created 0600): the same value masks the same way
everywhere, so analysis can still group by it, but a guess cannot be checked against the data
without the key. Delete the key file and new masks no longer match old ones.

Bodies are masked as the analyzer reads them: a JSON body (or each JSON line of an NDJSON
stream, or each `data:` payload of an SSE stream) is parsed and every string value is masked, then
written back compactly, so a match inside a JSON string can never break its escaping and an
escaped value (`\\u0040`) is matched as the text it stands for. Anything else is masked as text.
A stream delivers one text in many events (an e-mail address may arrive as `jane.do` and
`e@example.com`), so the pieces of each streamed output are joined before matching and a match
is cut back across them: the reassembled text reads exactly as if it had been masked whole, and
each event stays valid JSON. Runs on the writer thread, never on the event loop; what the client
receives is never changed (only the record is).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from toolproxy.record import keys
from toolproxy.record.model import Record
from toolproxy.record.spill import SpilledBody

KEY_FILE = "mask.key"


def luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(match: str) -> bool:
    digits = re.sub(r"[ -]", "", match)
    return 13 <= len(digits) <= 19 and luhn(digits)


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern
    accept: Callable[[str], bool] | None = None


BUILTIN: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
        Rule("api-key", re.compile(
            r"\bBearer\s+[A-Za-z0-9._~+/=-]{16,}|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}|\bgh[pousr]_[A-Za-z0-9]{30,}"
            r"|\bAKIA[0-9A-Z]{16}\b|\bxox[abpr]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_-]{35}")),
        Rule("credit-card", re.compile(r"\b\d(?:[ -]?\d){12,18}\b"), _card),
        Rule("ipv4", re.compile(r"\b(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\b")),
    )
}


def _load(s: str) -> Any:
    try:
        return orjson.loads(s)
    except orjson.JSONDecodeError:
        return None


def _strings(root: list):
    """(container, key, path) of every string in a JSON value. In the path a list element is
    named by its own `index` field when it has one (a streamed choice or tool call), else by its
    position, so the pieces of one output line up across events. Iterative: a body may nest as
    deep as the JSON parser allows, deeper than Python's recursion limit."""
    stack: list[tuple[Any, tuple]] = [(root, ())]
    while stack:
        value, path = stack.pop()
        nested = []
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            step = key
            if isinstance(value, list):
                index = item.get("index") if isinstance(item, dict) else None
                step = ("#", index if isinstance(index, int) else key)
            if isinstance(item, str):
                yield value, key, (*path, step)
            elif isinstance(item, (dict, list)):
                nested.append((item, (*path, step)))
        stack.extend(reversed(nested))


def _replace(parts: list[str], spans: list[tuple[int, int, str]]) -> list[str]:
    """`parts` with each (start, end, token) span of their concatenation replaced (see Masker.pieces)."""
    out = []
    j = 0
    offset = 0
    for part in parts:
        end = offset + len(part)
        pieces = []
        pos = offset
        while j < len(spans) and spans[j][0] < end:
            start, stop, token = spans[j]
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


def parse_rules(specs: tuple[str, ...] | list[str]) -> list[Rule]:
    """Built-in names or regular expressions. ValueError naming the bad one."""
    rules = []
    for spec in specs:
        if spec in BUILTIN:
            rules.append(BUILTIN[spec])
            continue
        try:
            pattern = re.compile(spec)
        except re.error as exc:
            raise ValueError(f"--mask {spec!r}: not a built-in set ({', '.join(BUILTIN)}) and not a valid "
                             f"regular expression: {exc}") from None
        if pattern.match(""):
            raise ValueError(f"--mask {spec!r} matches the empty string; it would mask nothing useful")
        rules.append(Rule(spec, pattern))
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


class Masker:
    def __init__(self, rules: list[Rule], key: bytes) -> None:
        self.rules = rules
        self.key = key
        self._tokens: dict[str, str] = {}

    def token(self, value: str) -> str:
        # Remembered: an agent resends its whole history every turn, so the same values recur.
        token = self._tokens.get(value)
        if token is None:
            if len(self._tokens) >= TOKEN_CACHE:
                self._tokens.clear()
            token = self._tokens[value] = "masked:" + hmac.new(
                self.key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]
        return token

    def _hit(self, rule: Rule, value: str, hits: Counter) -> str | None:
        """The token for a match the rule accepts (counted), else None."""
        if not value or (rule.accept is not None and not rule.accept(value)):
            return None
        hits[rule.name] += 1
        return self.token(value)

    def _spans(self, rule: Rule, s: str, hits: Counter) -> list[tuple[int, int, str]]:
        return [(m.start(), m.end(), token) for m in rule.pattern.finditer(s)
                if (token := self._hit(rule, m.group(0), hits)) is not None]

    def text(self, s: str, hits: Counter) -> str:
        for rule in self.rules:
            s = rule.pattern.sub(lambda m, rule=rule: self._hit(rule, m.group(0), hits) or m.group(0), s)
        return s

    def pieces(self, parts: list[str], hits: Counter) -> list[str]:
        """Text that arrived in pieces, masked as the one text it is: a match spanning pieces
        becomes one token, in the piece where the match starts; the pieces after it lose the
        matched characters they held. Joined, the result is the text masked whole."""
        for rule in self.rules:
            spans = self._spans(rule, "".join(parts), hits)
            if spans:
                parts = _replace(parts, spans)
        return parts

    def body(self, s: str, hits: Counter) -> str:
        """A recorded body: whole JSON, else line by line (NDJSON, SSE `data:` payloads, text).

        The strings of a stream's events are masked per output, not per event: the pieces one
        output was streamed in (see STREAMED_KEYS) are joined, so a value split across two deltas
        is found; every other string is masked on its own."""
        lines = [s]
        docs: list[tuple[int, str, list]] = []  # (line index, text before the JSON, [parsed JSON])
        doc = _load(s)
        if doc is not None:
            docs.append((0, "", [doc]))
        else:
            lines = s.split("\n")
            for i, line in enumerate(lines):
                lead, payload = ("data:", line[5:]) if line.startswith("data:") else ("", line)
                if not payload.strip():
                    continue
                doc = _load(payload)
                if doc is None:
                    lines[i] = lead + self.text(payload, hits)
                else:
                    docs.append((i, lead + payload[: len(payload) - len(payload.lstrip(" "))], [doc]))
        channels: dict[Any, list[tuple[int, Any, Any]]] = {}  # output -> (doc number, container, key) of its pieces
        changed: set[int] = set()
        for n, (_, _, holder) in enumerate(docs):
            doc = holder[0]
            ids = orjson.dumps([doc.get(k) for k in _EVENT_IDS], default=str) if isinstance(doc, dict) else b""
            for container, key, path in _strings(holder):
                if path[-1] in STREAMED_KEYS:
                    channels.setdefault((path, ids), []).append((n, container, key))
                else:
                    masked = self.text(container[key], hits)
                    if masked != container[key]:
                        container[key] = masked
                        changed.add(n)
        for refs in channels.values():
            before = [c[k] for _, c, k in refs]
            after = self.pieces(before, hits) if len(before) > 1 else [self.text(before[0], hits)]
            for (n, container, key), old, new in zip(refs, before, after):
                if new != old:
                    container[key] = new
                    changed.add(n)
        for n in changed:
            i, lead, holder = docs[n]
            try:
                lines[i] = lead + orjson.dumps(holder[0]).decode()
            except TypeError:  # nested deeper than orjson writes: mask the JSON text itself (counted above)
                lines[i] = self.text(lines[i], Counter())
        return "\n".join(lines)

    def record(self, rec: Record) -> Record:
        """A copy of the record with its text bodies masked and extra["masked"] counting matches
        per rule; the record itself (which the proxy may still read) is left as it is. Bodies
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
                # A body too large to hold while it passed: read back whole to be masked (at most
                # --max-body, on this thread), since a secret anywhere in it must not reach disk.
                data = value.read()
                if not value.utf8:
                    unmasked.append(field)
                    continue
                value = data.decode("utf-8")
                changes[f"{field}_encoding"] = "utf8"
            elif getattr(rec, f"{field}_encoding") == "base64":
                unmasked.append(field)
                continue
            masked = self.body(value, hits)
            if masked is not value or field + "_encoding" in changes:
                changes[field] = masked
        up = rec.upstream_request
        if up is not None and isinstance(up.get("body"), str):
            if up.get("body_encoding") != "base64":
                masked = self.body(up["body"], hits)
                if masked is not up["body"]:
                    changes["upstream_request"] = {**up, "body": masked}
            else:
                unmasked.append("upstream_request")
        extra = {**rec.extra, "masked": dict(hits)}
        if unmasked:
            extra["unmasked"] = unmasked
        return dataclasses.replace(rec, **changes, extra=extra)
