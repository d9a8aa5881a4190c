"""Which recorded exchange answers a request: pure functions over the fixture, no I/O.

The rules, in the spirit of mitmproxy's server replay options:

- A request matches a recorded one with the same method, path (tags taken off) and query (less
  parameters that carry secrets: the recording holds them redacted), and the same JSON body once
  volatile fields are dropped from both: `VOLATILE` at the top level (request ids, `user`,
  `metadata`, stream options, prompt-cache keys, timestamps a harness stamps its requests with).
  `stream` is never dropped: a streamed and a non-streamed reply are different bytes. An MCP
  request (a JSON-RPC message) is compared less its id and `params._meta` (protocol metadata,
  progress tokens, trace context), and only with the same server's: its reply goes back with the
  id of the request it answers (`wire.jsonrpc.with_id`).
- `--match` tunes this: `ignore=PATH` drops more (`temperature`, `messages.*.name`: dots go
  down, `*` is every item or key), `keep=FIELD` keeps a volatile field, `mask=REGEX` blanks
  what the pattern finds in every string (a date the harness writes into its prompt),
  `body=off` matches on method and path alone, `episodes=off` pools all episodes, `reuse=on`
  plays the last recorded reply again once a request's recorded replies are used up (an agent
  that polls, a load test).
- Several recorded exchanges can match: each is used once, in recorded order, so an agent that
  asks the same thing twice gets the two recorded replies in turn (a recorded retry gets its
  recorded 429 first, then the reply).
- Per episode where tags say so: a request tagged `episode=E` is answered from episode E's
  exchanges when the recording has that episode, else from the whole run.

A miss names the closest recorded request (same method and path, the longest common start of
the normalised bodies) and the first place where the two differ.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson

from toolproxy.playback.fixture import RecordedExchange
from toolproxy.proxy.headers import is_secret_name

VOLATILE = (
    "user",
    "metadata",
    "stream_options",
    "request_id",
    "id",
    "timestamp",
    "session_id",
    "prompt_cache_key",
    "safety_identifier",
)
# Beside VOLATILE: an MCP request's `params._meta` (its id, `id`, is a VOLATILE field already).
MCP_VOLATILE = (("params", "_meta"),)
MASKED = "<masked>"
_SHOWN = 60  # characters of a differing value shown in a miss


class MatchError(ValueError):
    """A --match value that cannot be used; the message says what is expected."""


@dataclass(frozen=True)
class MatchRules:
    ignore: tuple[tuple[str, ...], ...] = tuple((name,) for name in VOLATILE) + MCP_VOLATILE
    masks: tuple[re.Pattern, ...] = ()
    body: bool = True
    episodes: bool = True
    reuse: bool = False


def parse_rules(values: Iterable[str]) -> MatchRules:
    """`--match` values (`ignore=PATH`, `keep=FIELD`, `mask=REGEX`, `body=`, `episodes=`, `reuse=on|off`)
    applied in order to the default rules."""
    rules = MatchRules()
    for value in values:
        key, sep, arg = value.partition("=")
        if not sep or not arg:
            raise MatchError(
                f"--match {value!r}: expected KEY=VALUE, one of ignore=PATH, keep=FIELD, mask=REGEX, "
                "body=on|off, episodes=on|off, reuse=on|off"
            )
        if key == "ignore":
            rules = replace(rules, ignore=rules.ignore + (tuple(arg.split(".")),))
        elif key == "keep":
            rules = replace(rules, ignore=tuple(p for p in rules.ignore if p != tuple(arg.split("."))))
        elif key == "mask":
            try:
                rules = replace(rules, masks=rules.masks + (re.compile(arg),))
            except re.error as exc:
                raise MatchError(f"--match mask={arg!r} is not a regular expression: {exc}") from None
        elif key in ("body", "episodes", "reuse"):
            if arg not in ("on", "off"):
                raise MatchError(f"--match {key}= takes on or off (got {arg!r})")
            rules = replace(rules, **{key: arg == "on"})
        else:
            raise MatchError(f"--match {value!r}: unknown key {key!r} (ignore, keep, mask, body, episodes, reuse)")
    return rules


def normalise(body: bytes, rules: MatchRules) -> Any:
    """The body as it is compared: parsed JSON less the ignored fields, masks applied; a body that
    is not JSON compares as its bytes (masks applied to its text when it is UTF-8)."""
    if not rules.body:
        return None
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        try:
            return _mask(body.decode("utf-8"), rules.masks)
        except UnicodeDecodeError:
            return body.hex()
    for path in rules.ignore:
        doc = _drop(doc, path)
    if not rules.masks:
        return doc
    try:
        return _mask(doc, rules.masks)
    except RecursionError:  # nested deeper than Python recurses: compared unmasked
        return doc


def _drop(doc: Any, path: tuple[str, ...]) -> Any:
    if not path:
        return doc
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        if head == "*":
            return {k: _drop(v, rest) for k, v in doc.items()} if rest else {}
        if head not in doc:
            return doc
        if not rest:
            return {k: v for k, v in doc.items() if k != head}
        return {**doc, head: _drop(doc[head], rest)}
    if isinstance(doc, list) and (head == "*" or head.isdigit()):
        if head == "*":
            return [_drop(v, rest) for v in doc] if rest else []
        i = int(head)
        if i >= len(doc):
            return doc
        return doc[:i] + ([_drop(doc[i], rest)] if rest else []) + doc[i + 1 :]
    return doc


def _mask(doc: Any, masks: tuple[re.Pattern, ...]) -> Any:
    if isinstance(doc, str):
        for pattern in masks:
            doc = pattern.sub(MASKED, doc)
        return doc
    if isinstance(doc, dict):
        return {k: _mask(v, masks) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_mask(v, masks) for v in doc]
    return doc


def query_key(query: str) -> str:
    """The query as compared: parameters that carry secrets left out (recorded ones are redacted)."""
    if not query:
        return ""
    return urlencode([(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if not is_secret_name(k)])


def canonical(doc: Any, body: bytes) -> bytes:
    """The normalised body as compared: sorted-key JSON, or, for a document nested deeper than
    orjson writes (254 levels), the body's own bytes (such a body matches only itself)."""
    try:
        return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return b"\0" + body


@dataclass(frozen=True)
class Miss:
    """No recorded exchange is left for a request: the closest one, and how they differ."""

    closest: RecordedExchange | None
    difference: str
    used_up: int  # recorded exchanges that matched but were already played

    def message(self) -> str:
        if self.used_up:
            return (
                f"toolproxy playback: all {self.used_up} recorded replies to this request were already played "
                f"(each recorded exchange answers once, in order; the last was {self.closest.id})"
            )
        if self.closest is None:
            return f"toolproxy playback: no recorded request to this method and path ({self.difference})"
        where = f", episode {self.closest.episode}" if self.closest.episode else ""
        return (
            f"toolproxy playback: no recorded exchange matches this request; closest is {self.closest.id}"
            f"{where}: {self.difference} (tune matching with --match, or record the miss with --on-miss record)"
        )


class Matcher:
    """The fixture's exchanges by (method, path, query, normalised body), each queue in recorded
    order, once for the whole run and once per episode; `take` hands each exchange out once."""

    def __init__(self, exchanges: list[RecordedExchange], rules: MatchRules) -> None:
        self.rules = rules
        self.exchanges = exchanges
        self.normalised = [normalise(x.request_body, rules) for x in exchanges]
        self.canon = [canonical(doc, x.request_body) for doc, x in zip(self.normalised, exchanges)]
        self.pooled: dict[tuple, deque[int]] = defaultdict(deque)
        self.by_episode: dict[tuple, deque[int]] = defaultdict(deque)
        self.episodes = {x.episode for x in exchanges if x.episode is not None} if rules.episodes else set()
        self.used: set[int] = set()
        self.played: dict[tuple, list[int]] = defaultdict(list)
        for i, x in enumerate(exchanges):
            key = self._key(x.method, x.path, x.query, self.canon[i], x.mcp_server)
            self.pooled[key].append(i)
            if x.episode in self.episodes:
                self.by_episode[key + (x.episode,)].append(i)

    @staticmethod
    def _key(method: str, path: str, query: str, canon: bytes, server: str | None) -> tuple:
        return (method.upper(), path, query_key(query), canon, server)

    def take(
        self, method: str, path: str, query: str, body: bytes, episode: str | None, server: str | None = None
    ) -> RecordedExchange | Miss:
        """The recorded exchange that answers this request (of MCP server `server`, or a model's)."""
        doc = normalise(body, self.rules)
        mine = canonical(doc, body)
        key = self._key(method, path, query, mine, server)
        own = episode in self.episodes
        queue = self.by_episode.get(key + (episode,)) if own else self.pooled.get(key)
        while queue and queue[0] in self.used:  # taken through the other index
            queue.popleft()
        played = self.played[key + ((episode,) if own else ())]
        if queue:
            i = queue.popleft()
            self.used.add(i)
            played.append(i)
            return self.exchanges[i]
        if played:
            if self.rules.reuse:
                return self.exchanges[played[-1]]
            return Miss(self.exchanges[played[-1]], "", len(played))
        return self._closest(method, path, key[2], doc, mine, episode if own else None, server)

    def _closest(
        self, method: str, path: str, query: str, doc: Any, mine: bytes, episode: str | None, server: str | None
    ) -> Miss:
        same = [
            i
            for i, x in enumerate(self.exchanges)
            if x.method.upper() == method.upper() and x.path == path and x.mcp_server == server
        ]
        if not same:
            paths = sorted({f"{x.method} {x.path}" for x in self.exchanges if x.mcp_server == server})
            return Miss(None, f"{method} {path} was never recorded; recorded: {', '.join(paths[:8])}", 0)
        best = max(
            same,
            key=lambda i: (
                self.exchanges[i].episode == episode,
                _common_start(self.canon[i], mine),
                -abs(len(self.canon[i]) - len(mine)),
                -i,
            ),
        )
        x = self.exchanges[best]
        if query_key(x.query) != query:
            return Miss(x, f"query: recorded {x.query!r}, here {query!r}", 0)
        try:
            found = first_difference(self.normalised[best], doc)
        except (RecursionError, TypeError):  # TypeError: a value nested too deep for orjson to show
            return Miss(x, "the bodies differ (nested too deep to say where)", 0)
        if found is None:  # the same request, recorded in another episode only
            found = f"recorded in episode {x.episode}, asked in episode {episode} (--match episodes=off pools them)"
        return Miss(x, found, 0)


def _common_start(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # the longest equal start, by halving (bytes compare in C)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def first_difference(recorded: Any, here: Any, path: str = "") -> str | None:
    """Where `here` first differs from `recorded`, in words (`messages[2].content: recorded "...",
    here "..."`); None when they are equal."""
    where = path or "body"
    if isinstance(recorded, dict) and isinstance(here, dict):
        for k in list(recorded) + [k for k in here if k not in recorded]:
            sub = f"{path}.{k}" if path else k
            if k not in here:
                return f"{sub}: recorded {_shown(recorded[k])}, missing here"
            if k not in recorded:
                return f"{sub}: not in the recorded request, here {_shown(here[k])}"
            found = first_difference(recorded[k], here[k], sub)
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(here, list):
        for i, (a, b) in enumerate(zip(recorded, here)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        if len(recorded) != len(here):
            return f"{where}: recorded {len(recorded)} items, here {len(here)}"
        return None
    if recorded == here and type(recorded) is type(here):
        return None
    return f"{where}: recorded {_shown(recorded)}, here {_shown(here)}"


def _shown(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
