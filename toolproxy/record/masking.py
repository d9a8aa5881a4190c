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
A value split across two streamed deltas is not seen whole and is not masked; the stream's
final message, when the stack sends one, is. Runs on the writer thread, never on the event loop;
what the client receives is never changed (only the record is).
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


class Masker:
    def __init__(self, rules: list[Rule], key: bytes) -> None:
        self.rules = rules
        self.key = key

    def token(self, value: str) -> str:
        return "masked:" + hmac.new(self.key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]

    def text(self, s: str, hits: Counter) -> str:
        for rule in self.rules:
            def sub(m: re.Match, rule: Rule = rule) -> str:
                if rule.accept is not None and not rule.accept(m.group(0)):
                    return m.group(0)
                hits[rule.name] += 1
                return self.token(m.group(0))

            s = rule.pattern.sub(sub, s)
        return s

    def _value(self, v: Any, hits: Counter) -> Any:
        if isinstance(v, str):
            return self.text(v, hits)
        if isinstance(v, list):
            return [self._value(x, hits) for x in v]
        if isinstance(v, dict):
            return {k: self._value(x, hits) for k, x in v.items()}
        return v

    def _json(self, s: str, hits: Counter) -> str | None:
        """JSON text with its strings masked (unchanged when nothing matched); None if not JSON."""
        try:
            doc = orjson.loads(s)
        except orjson.JSONDecodeError:
            return None
        before = sum(hits.values())
        masked = self._value(doc, hits)
        return orjson.dumps(masked).decode() if sum(hits.values()) > before else s

    def _json_or_text(self, s: str, hits: Counter) -> str:
        masked = self._json(s, hits)
        return self.text(s, hits) if masked is None else masked

    def body(self, s: str, hits: Counter) -> str:
        """A recorded body: whole JSON, else line by line (NDJSON, SSE `data:` payloads, text)."""
        masked = self._json(s, hits)
        if masked is not None:
            return masked
        lines = s.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("data:"):
                payload = line[5:]
                lead = payload[: len(payload) - len(payload.lstrip(" "))]
                lines[i] = "data:" + lead + self._json_or_text(payload.lstrip(" "), hits)
            elif line.strip():
                lines[i] = self._json_or_text(line, hits)
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
            if getattr(rec, f"{field}_encoding") == "base64":
                unmasked.append(field)
                continue
            masked = self.body(value, hits)
            if masked is not value:
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
