"""Attempts -> turns -> episodes -> runs.

A harness may retry the same request (same messages, same tools) after a failure: those attempts
are one turn, whose outcome is the last attempt's; a turn whose every attempt failed keeps the
cause of its last failure (a refusal stays `refused`) with the attempt count beside it. Episodes
come from the `episode` tag; without one they are reconstructed by message-prefix chaining: a
later request whose message list starts with an earlier request's messages *plus the reply it
got* continues that episode. Harnesses that resend an earlier call as assistant text chain by an
echo key instead (request + the calls it echoes); one that dropped a reply and added a note of its
own, by the state of the request before it; one that swapped its system prompt to wrap up, by the
conversation without it. Identical episodes running at the same time are told apart by the ids of
their replies' calls, and each is continued once even when nothing tells them apart.

Every produced turn then gets a role (analysis.episodes.roles), which says what the turn was for and so which
metric counts it: a correct agent that calls a tool and then answers in prose must score full
marks, so its final answer is an `answer`, not a missed call.

Everything keyed on conversation content uses canonical message hashes computed once per
exchange at ingest (conversation_keys), so re-deriving a run reads small columns, not bodies.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import re
import statistics
import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Sequence

import orjson

from toolproxy.analysis.episodes.roles import ROLE_SQL
from toolproxy.analysis.ingest import harnesses
from toolproxy.analysis.ingest.echoes import echoed_calls
from toolproxy.analysis.measure.expectations import Rule, expectation
from toolproxy.analysis.measure.outcomes import ANALYZER_VERSION, EMPTY_REPLIES, NON_RESPONSE, VALID_CALL
from toolproxy.analysis.store.columns import share_strings
from toolproxy.analysis.store.tables import EPISODES, TURNS
from toolproxy.calls.gcpause import gc_paused

UNTAGGED_RUN = "(untagged)"
# An episode is flagged as looping when the same call (name + arguments) repeats in this many
# consecutive turns, or when it has at least LOOP_MIN_TURNS turns and LOOP_MEDIAN_FACTOR times
# the run's median turn count.
LOOP_REPEATS = 3
LOOP_MEDIAN_FACTOR = 3.0
LOOP_MIN_TURNS = 10

_SEP = re.compile(r"[_-]")
# A text-protocol harness (smolagents, ReAct loops) returns a tool's result as a user message
# that starts a line with "Observation:".
_OBSERVATION = re.compile(r"(?m)^\s*Observation:")
_RESULT_ROLES = frozenset(("tool", "function", "ipython"))
_RESULT_PARTS = frozenset(("tool_result", "function_call_output"))
# The signature an echo of an empty reply carries (outcomes.EMPTY_REPLIES: the kinds of such a reply).
EMPTY_ECHO = "empty"


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=12).digest()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):  # content parts: only the text is conversation state we can match
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)).strip()
    return ""


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value.strip()
    return value


def canon_calls(calls: Iterable[tuple[str | None, Any]]) -> list:
    return [[name, _args(args)] for name, args in calls]


def _canon(role: Any, text: str, calls: list) -> bytes:
    """Serialization of a message that survives a harness resending it: ids, whitespace around
    content (`text` is _text of it), null-vs-empty content and the spelling of argument JSON do
    not matter."""
    return orjson.dumps([role, text, calls], option=orjson.OPT_SORT_KEYS)


def _is_tool_result(role: Any, content: Any, text: str) -> bool:
    """Whether a message (its role, content and _text of it) returns a tool's result to the
    model, in any of the ways harnesses write it."""
    if role in _RESULT_ROLES:
        return True
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in _RESULT_PARTS for p in content):
        return True
    return role == "user" and "Observation:" in text and _OBSERVATION.search(text) is not None


def _message_calls(m: dict) -> list:
    """canon_calls of a chat message's tool_calls (entries that are not objects are skipped)."""
    pairs = []
    for tc in m.get("tool_calls") or ():
        if isinstance(tc, dict):
            fn = tc.get("function")
            pairs.append((fn.get("name"), fn.get("arguments")) if isinstance(fn, dict) else (None, None))
    return canon_calls(pairs)


class Keys(NamedTuple):
    n_messages: int
    state_hash: str
    chain_hash: str | None
    parent_hashes: list[str]
    item_hash: str
    tool_results: int
    reply_keys: list[str]
    rejects: bool


# A harness that drops a useless reply resends the conversation before it plus a note of its own
# (pydantic-ai: "Please return text or call a tool."): the request names the states of its
# prefixes that end after its last assistant message, at most this many, as dropped-reply parents.
DROPPED_PREFIXES = 3
_SYSTEM_ROLES = frozenset(("system", "developer"))


def conversation_keys(
    messages: Sequence[Any],
    *,
    tool_set: str | None,
    tool_names: Sequence[str],
    model: str | None,
    reply: tuple[str | None, list] | None,
    reply_ids: Sequence[str] = (),
    asks_again: bool = False,
    reply_unread: bool = False,
) -> Keys:
    """Hashes that place one attempt in its conversation.

    state_hash: messages + tool set + model (equal for retries of one turn).
    chain_hash: the message list extended by the reply the harness got (content, canon calls);
      the next turn of the same episode lists it as a parent.
    parent_hashes: the keys of the turns this request may continue, in the order they are tried
      (build_episodes takes the first one it knows), longest conversation first: the request keys
      of the prefixes after the last assistant message (longest first), the ids key of the last
      assistant messages' calls, the rolling hash after the last assistant message, the echo keys
      of the last assistant messages (_echo_parents), the tail key (the conversation without its
      leading system messages, up to the last assistant message), the unread keys of the state
      before those messages and of its tail (the request they answered, if its reply could not be
      read whole), then the rolling hash after each earlier assistant message (longest first).
    item_hash: messages + offered tool names, for pairing the same item across runs.
    tool_results: how many messages return a tool's result to the model (see _is_tool_result).
    reply_keys: the keys beside chain_hash that a later request names this reply by: its ids key
      (the reply's call ids, `reply_ids`: what tells identical conversations apart), its tail key,
      and, when `reply_unread` (a call's arguments did not parse, so the reply's canonical form may
      not be the one the harness writes back: dspy repairs the JSON), the unread keys of this
      request and of its tail.
    rejects: the messages after the last assistant message say the harness could not use the reply
      before them (analysis.ingest.harnesses).
    asks_again: the request may be the one before it asked again in the harness's fallback format
      (analysis.ingest.protocols.Reading.fallback): its own state's request key is tried first, so it
      continues the turn that asked the same (turn_facts then reads that turn as rejected).
    """
    # One running hash over the canonical messages (JSON arrays, so self-delimiting): a prefix's
    # hash is a copy of the running state, which keeps this linear in the conversation length.
    running = hashlib.blake2b(digest_size=12)
    # The same without the leading system messages: a harness that swaps its system prompt for
    # another (smolagents' summary at max_steps, dspy's extract step) keeps the rest.
    tail = hashlib.blake2b(b"tail", digest_size=12)
    leading = True
    parents = []
    results = 0
    # The last run of consecutive assistant messages, its structured calls and ids, the running hash before it.
    block: list[str] = []  # their texts
    block_calls: list = []
    block_ids: list[str] = []
    block_prefix = block_tail = None  # the running hash before it, and the tail hash
    tail_parent = None
    after: list = []  # running hashes after each message since the last assistant one (and the first non-system one)
    after_texts: list[str] = []  # those messages' texts
    prev_role = None
    update = running.update
    for m in messages:
        if isinstance(m, dict):
            role = m.get("role")
            content = m.get("content")
            text = content.strip() if type(content) is str else _text(content)
            results += _is_tool_result(role, content, text)
            calls = _message_calls(m) if m.get("tool_calls") else []
            if role == "assistant" and prev_role != "assistant":
                block, block_calls, block_ids, block_prefix, block_tail = [], [], [], running.copy(), tail.hexdigest()
            canon = _canon(role, text, calls)
            update(canon)
            leading = leading and role in _SYSTEM_ROLES
            if not leading:
                tail.update(canon)
            if role == "assistant":
                block.append(text)
                block_calls.extend(calls)
                block_ids.extend(_call_ids(m))
                parents.append(running.hexdigest())
                tail_parent = tail.hexdigest()
                after, after_texts = [], []
            elif not leading:
                after.append(running.copy())
                after_texts.append(text)
                del after[:-DROPPED_PREFIXES - 1]
        else:
            role = None
            update(orjson.dumps([m]))
        prev_role = role
    parents.reverse()
    state_suffix = b"\x00state" + orjson.dumps([tool_set, model])
    dropped = []
    for prefix in reversed(after[:-1]):  # longest first; the whole list is this request's own state
        prefix.update(state_suffix)
        dropped.append(request_key(prefix.hexdigest()))
    # Longest conversation first: every key that ends at the last assistant message (its exact
    # hash, then the same conversation as an echo or without its system prompt) comes before the
    # exact hash of any earlier one. An earlier one may name a turn another request continued
    # already (smolagents resends a call as text, which only its echo key matches, after a reply
    # it kept as it came), and the first key known decides.
    earlier = parents[1:]
    del parents[1:]
    if block_ids and parents:
        parents.insert(0, ids_key(parents[0], block_ids))
    if block_prefix is not None:
        before = block_prefix.copy()
        before.update(state_suffix)
        before_last = before.hexdigest()
        parents += _echo_parents(block, block_calls, before_last, tool_names)
    if tail_parent is not None:
        parents.append(tail_parent)
    if block_prefix is not None:  # the request those messages answered, when its reply's reading lost something
        parents += [unread_key(before_last), unread_key(block_tail)]
    parents += earlier
    state = running.copy()
    state.update(state_suffix)
    if asks_again:
        dropped.insert(0, request_key(state.hexdigest()))
    item = running.copy()
    item.update(b"\x00item" + orjson.dumps(sorted(tool_names)))
    chain = None
    reply_keys = []
    if reply is not None and reply_unread:
        reply_keys += [unread_key(state.hexdigest()), unread_key(tail.hexdigest())]
    if reply is not None:
        canon = _canon("assistant", _text(reply[0]), canon_calls(reply[1]))
        extended = running.copy()
        extended.update(canon)
        chain = extended.hexdigest()
        ids = [i for i in reply_ids if isinstance(i, str) and i]
        if ids:
            reply_keys.append(ids_key(chain, ids))
        tail.update(canon)
        reply_keys.append(tail.hexdigest())
    rejected = block_prefix is not None and harnesses.rejects(after_texts)
    return Keys(len(messages), state.hexdigest(), chain, dropped + parents, item.hexdigest(), results, reply_keys, rejected)


def _call_ids(m: dict) -> list[str]:
    """The ids of a chat message's tool calls (the stack made them up per reply, so they tell apart
    identical conversations running at the same time)."""
    return [tc["id"] for tc in m.get("tool_calls") or () if isinstance(tc, dict) and isinstance(tc.get("id"), str) and tc["id"]]


def ids_key(chain_hash: str, ids: Sequence[str]) -> str:
    """The key of a reply's calls by their ids: its chain hash + the ids, in order."""
    return _digest(b"ids\x00" + chain_hash.encode() + b"\x00" + "\x00".join(ids).encode()).hex()


def request_key(state_hash: str) -> str:
    """The key a later request names a turn by through the state of the request that turn answered,
    without its reply: the harness dropped the reply and added words of its own, or asked the same
    again in another format."""
    return _digest(b"dropped\x00" + state_hash.encode()).hex()


def unread_key(state_hash: str) -> str:
    """The key of a turn whose reply could not be read whole (a call's arguments did not parse), by
    the state (or tail) of its request: a later request that extends that request by one assistant
    message continues it, whatever the harness made of the reply (dspy repairs the JSON a model
    broke before it writes the step into its next prompt)."""
    return _digest(b"unread\x00" + state_hash.encode()).hex()


def echo_key(state_hash: str, signature: str) -> str:
    """The parent key of a reply that made calls, as a later request re-serialising them shows it:
    the request it answered (state hash) + the calls (signature), whatever text carried them."""
    return _digest(b"echo\x00" + state_hash.encode() + b"\x00" + signature.encode()).hex()


def _echo_parents(block: Sequence[str], calls: list, before: str, tool_names: Sequence[str]) -> list[str]:
    """echo_key(before, calls) of the request's last run of assistant messages (`block`: their
    texts, with its structured `calls`; `before`: the state of the conversation before it), for its
    structured calls, else for every reading of calls re-serialised in its text (analysis.ingest.echoes).

    Only the last run: it answers the turn just before this request, the one to chain to, and
    looking no further keeps the text search at one block per request, not one per turn.

    A run with no text and no call echoes an empty reply (EMPTY_ECHO): a harness that writes the
    nothing it got into its history (smolagents does, then adds its error message) continues the
    episode whose turn came back empty, which exact chaining cannot follow (a non-response has
    no chain hash)."""
    text = "\n".join(block)
    if calls:
        signatures = [call_signature(calls)]
    elif not text:
        signatures = [EMPTY_ECHO]
    else:
        signatures = [call_signature(canon_calls(r)) for r in echoed_calls(text, tool_names)]
    return [echo_key(before, sig) for sig in signatures]


def call_signature(calls: Sequence[tuple[str | None, Any]]) -> str | None:
    if not calls:
        return None
    return _digest(orjson.dumps(canon_calls(calls), option=orjson.OPT_SORT_KEYS)).hex()


def category_of(item_key: str | None, tag: str | None) -> str | None:
    """The `category` tag, else the item key's prefix before the first `_` or `-` (BFCL `simple_12`)."""
    if tag:
        return tag
    if not item_key or item_key.startswith("h:"):
        return None
    parts = _SEP.split(item_key, 1)
    return parts[0] if len(parts) == 2 and parts[0] else None


@dataclass(slots=True)
class Attempt:
    """What grouping an attempt into its turn and episode needs of it. What a turn copies from its
    final attempt (model, surface, content, ...) derive() joins from exchanges in SQL."""

    id: str
    episode: str | None
    item: str | None
    category: str | None
    condition: str | None
    outcome: str
    sub_kind: str | None
    harness_saw_prose: bool
    state_hash: str | None
    chain_hash: str | None
    parent_hashes: list[str]
    item_hash: str | None
    call_signature: str | None
    tags: str | None = None
    tool_results: int = 0
    reply_keys: list[str] = field(default_factory=list)
    rejects: bool = False  # its request says the harness could not use the reply before it
    offered: bool = True  # its request offered tools (in a `tools` field or its prompt)


def attempt_of(row: dict, share=lambda value: value) -> Attempt:
    """The Attempt of an exchanges row as analysis.ingest.records makes it (what derive's _ATTEMPTS_SQL
    reads back of it). `share` maps each string that repeats along a run (its tags, outcome, the
    conversation keys later requests name again) to the object to keep, so it is held once."""
    tags = orjson.loads(row["tags"]) if row.get("tags") else {}
    category = tags.get("category") if isinstance(tags, dict) else None
    if category is not None and not isinstance(category, str):
        category = orjson.dumps(category).decode()
    kept = [None if v is None else share(v) for v in (row["episode"], row["item"], category, row["condition"],
                                                        row["outcome"], row["sub_kind"], row["tags"])]
    episode, item, category, condition, outcome, sub_kind, tags_text = kept
    return Attempt(
        row["id"], episode, item, category, condition, outcome, sub_kind, bool(row["harness_saw_prose"]),
        row["state_hash"], row["chain_hash"], [share(k) for k in row["parent_hashes"] or ()], row["item_hash"],
        row["call_signature"], tags_text, row["tool_results"] or 0, [share(k) for k in row["reply_keys"] or ()],
        bool(row["rejects"]), row["tool_set"] is not None)


@dataclass(slots=True)
class Turn:
    attempts: list[Attempt]

    @property
    def final(self) -> Attempt:
        return self.attempts[-1]

    def result(self) -> tuple[str, str | None]:
        """(outcome, sub_kind): the final attempt's. When every retry failed, the cause stays named
        (`refused`, `http_5xx`, ...) and the attempt count is the turn's n_attempts."""
        f = self.final
        return f.outcome, f.sub_kind


@dataclass(slots=True)
class Episode:
    key: str
    name: str
    reconstructed: bool
    turns: list[Turn] = field(default_factory=list)
    item_key: str | None = None
    category: str | None = None
    looping: bool = False
    loop_reason: str | None = None


def chain_keys(a: Attempt) -> list[str]:
    """The keys a later request names this attempt by when it continues the conversation (its
    parent_hashes): the conversation extended by the reply, that reply's ids and tail keys, the
    echo key of the reply's calls (or of an empty reply), and its request's request key."""
    keys = [a.chain_hash] if a.chain_hash else []
    keys += a.reply_keys
    if a.state_hash and a.call_signature:
        keys.append(echo_key(a.state_hash, a.call_signature))
    elif a.state_hash and a.outcome == NON_RESPONSE and a.sub_kind in EMPTY_REPLIES:
        keys.append(echo_key(a.state_hash, EMPTY_ECHO))
    if a.state_hash:
        keys.append(request_key(a.state_hash))
    return keys


def causal_order(attempts: Sequence[Attempt], keys: Sequence[list[str]] | None = None) -> list[int]:
    """The positions of the attempts (given in clock order: started_at, id) in an order that
    follows the conversations: every request after the turn whose reply it continues, and a turn's
    failed attempts before its answered one. `keys`: each attempt's chain_keys, if already known.

    Replicas on different hosts stamp exchanges with their own clocks. When those disagree by more
    than a harness's think time, clock order puts a turn before the reply it answers, and chaining
    would start a new episode there. What a request contains cannot be skewed: a request that
    carries a reply came after it, and a harness resends a request only after it failed. So
    attempts are sorted topologically on those two relations, ties (unrelated attempts) in clock
    order. When the clocks agree with the conversations, as on one host, the order is unchanged.

    What content cannot tell stays in clock order: two failed attempts of one turn (which one's
    cause the turn keeps) and identical conversations in different episodes. Those need the
    replicas' clocks within the harness's retry delay, which NTP keeps easily (milliseconds).
    """
    n = len(attempts)
    if keys is None:
        keys = [chain_keys(a) for a in attempts]
    providers: dict[str, list[int]] = {}  # key -> positions of the attempts it names, ascending
    for i, ks in enumerate(keys):
        for key in ks:
            providers.setdefault(key, []).append(i)
    edges: list[tuple[int, int]] = []  # (before, after)
    groups: dict[tuple, list[int]] = {}  # the attempts of one turn: retries of one request
    for i, a in enumerate(attempts):
        parent = None
        for h in a.parent_hashes:  # longest first: the first one found is the turn it continues
            found = providers.get(h)
            if found is None:
                continue
            # The latest such turn before it in clock order, as chaining would pick, else the first after.
            pos = bisect.bisect_left(found, i)
            if pos:
                parent = found[pos - 1]
            else:
                later = found[1:] if found[0] == i else found
                if not later:
                    continue
                parent = later[0]
            if attempts[parent].episode != a.episode:  # a request only continues turns of its own episode
                parent = None
                continue
            edges.append((parent, i))
            break
        anchor = a.episode if a.episode is not None else parent
        if anchor is not None and a.state_hash:
            groups.setdefault((anchor, a.state_hash), []).append(i)
    for members in groups.values():
        answered = next((j for j in members if attempts[j].outcome != NON_RESPONSE), None)
        if answered is not None:
            edges += [(j, answered) for j in members if attempts[j].outcome == NON_RESPONSE]
    if all(before < after for before, after in edges):  # the clocks got it right: nothing moves
        return list(range(n))
    after: list[list[int]] = [[] for _ in range(n)]
    waiting = [0] * n
    for before, later in edges:
        after[before].append(later)
        waiting[later] += 1
    ready = [i for i in range(n) if not waiting[i]]
    heapq.heapify(ready)
    out: list[int] = []
    done = [False] * n
    while len(out) < n:
        if not ready:  # a cycle (only colliding hashes could make one): release the earliest
            heapq.heappush(ready, next(i for i in range(n) if not done[i]))
        i = heapq.heappop(ready)
        if done[i]:
            continue
        done[i] = True
        out.append(i)
        for k in after[i]:
            waiting[k] -= 1
            if waiting[k] == 0 and not done[k]:
                heapq.heappush(ready, k)
    return out


def build_episodes(run: str, attempts: Iterable[Attempt], one_clock: bool = False) -> list[Episode]:
    """Group one run's attempts (given in clock order) into episodes of turns. Unless one clock
    stamped them all (one host: its clock order is the conversations' order), they are first put
    in causal_order.

    Several episodes may be open on the same conversation at once (a benchmark's epochs, threads
    asking one question): every key names all the turns it was given by, and a request continues
    the first of them, in clock order, that is still its episode's last turn. The keys that tell
    such copies apart (the ids of the calls a reply made) come first in a request's parents, so a
    copy follows its own reply; copies that nothing tells apart are still each continued once. The
    first key a request names that any turn was given by decides: when all its turns were
    continued already, the request starts an episode of its own (the same step taken again)."""
    episodes: dict[str, Episode] = {}
    owner: dict[int, Episode] = {}  # id(turn) -> its episode
    by_chain: dict[str, deque[Turn]] = {}
    by_state: dict[str, deque[Turn]] = {}  # turns whose last attempt failed, by their request's state

    def is_open(turn: Turn) -> bool:
        return owner[id(turn)].turns[-1] is turn

    def oldest(queue: deque[Turn], usable) -> Turn | None:
        while queue and not usable(queue[0]):  # a turn that stops being usable never is again
            queue.popleft()
        return queue[0] if queue else None

    def retried(turn: Turn) -> bool:
        return turn.attempts[-1].outcome == NON_RESPONSE and is_open(turn)

    attempts = list(attempts)
    keys = None if one_clock else [chain_keys(a) for a in attempts]
    for i in range(len(attempts)) if keys is None else causal_order(attempts, keys):
        a = attempts[i]
        if a.episode is not None:
            key = f"{run}/{a.episode}"
            ep = episodes.get(key)
            if ep is None:
                ep = episodes[key] = Episode(key, a.episode, False)
            if ep.turns and (final := ep.turns[-1].attempts[-1]).outcome == NON_RESPONSE and final.state_hash == a.state_hash:
                ep.turns[-1].attempts.append(a)
            else:
                ep.turns.append(Turn([a]))
            continue
        failed = by_state.get(a.state_hash) if a.state_hash else None
        turn = oldest(failed, retried) if failed else None
        if turn is not None:
            turn.attempts.append(a)
        else:
            ep = None
            for h in a.parent_hashes:
                queue = by_chain.get(h)
                if queue is not None:
                    parent = oldest(queue, is_open)
                    if parent is not None:
                        ep = owner[id(parent)]
                    break
            if ep is None:
                name = f"~{a.id}"
                ep = episodes[f"{run}/{name}"] = Episode(f"{run}/{name}", name, True)
            turn = Turn([a])
            ep.turns.append(turn)
            owner[id(turn)] = ep
        if a.outcome == NON_RESPONSE and a.state_hash and not (failed and failed[-1] is turn):
            by_state.setdefault(a.state_hash, deque()).append(turn)
        for key in chain_keys(a) if keys is None else keys[i]:
            by_chain.setdefault(key, deque()).append(turn)
    out = list(episodes.values())
    for ep in out:
        heads = [t.attempts[0] for t in ep.turns]
        first = ep.turns[0].attempts[-1]
        explicit = next((h.item for h in heads if h.item), None)
        ep.item_key = explicit or (f"h:{first.item_hash}" if first.item_hash else None)
        tag = next((h.category for h in heads if h.category), None)
        ep.category = category_of(ep.item_key, tag)
    mark_loops(out)
    return out


def mark_loops(episodes: list[Episode]) -> None:
    if not episodes:
        return
    median = statistics.median(len(ep.turns) for ep in episodes)
    for ep in episodes:
        ep.loop_reason = loop_reason([t.attempts[-1].call_signature for t in ep.turns], median)
        ep.looping = ep.loop_reason is not None


def loop_reason(signatures: Sequence[str | None], run_median: float) -> str | None:
    """Why an episode counts as looping, or None. See LOOP_* for the thresholds."""
    best = streak = 0
    prev = None
    for sig in signatures:
        streak = streak + 1 if sig is not None and sig == prev else 1
        prev = sig
        if sig is not None:
            best = max(best, streak)
    if best >= LOOP_REPEATS:
        return f"{best} identical consecutive calls"
    n = len(signatures)
    if n >= LOOP_MIN_TURNS and n >= LOOP_MEDIAN_FACTOR * run_median:
        return f"{n} turns, run median {run_median:g}"
    return None


def match_tags(tags_json: str | None, **known: str | None) -> dict[str, str | None]:
    """The tags an expectation rule sees for an episode: its free tags plus the named ones."""
    free = orjson.loads(tags_json) if tags_json else {}
    if not isinstance(free, dict):
        free = {}
    return {str(k): v if v is None or isinstance(v, str) else str(v) for k, v in free.items()} | known


def delivered(turns: Sequence[Turn], i: int) -> bool:
    """Did turn i's valid call reach the harness as a call it acted on?

    A call in tool_calls (the stack's, or one a condition produced) was delivered. A call left in
    the reply text counts only when the harness parsed it itself and acted on it, which shows as
    the episode's next request carrying more tool results than this one (smolagents and other
    text-protocol harnesses) and not saying it could not use the reply; a harness that ignored it
    got prose.
    """
    f = turns[i].final
    if f.outcome != VALID_CALL:
        return False
    if not f.harness_saw_prose:
        return True
    if i + 1 >= len(turns):
        return False
    after = turns[i + 1].attempts[0]
    return after.tool_results > f.tool_results and not after.rejects


class TurnFacts(NamedTuple):
    """What a turn's place in its episode says of it (the rest of a turn is its final attempt's)."""

    delivered: bool  # its valid call reached the harness as a call (see delivered)
    saw_result: bool  # a tool result came back in the episode by this turn
    is_last: bool
    rejected: bool  # the next request says the harness could not use this reply
    last_with_tools: bool  # no later turn of the episode offered tools


def turn_facts(turns: Sequence[Turn]) -> list[TurnFacts]:
    """TurnFacts of each turn of one episode, in order."""
    last = len(turns) - 1
    last_tools = max((i for i, t in enumerate(turns) if t.attempts[-1].offered), default=-1)
    out = []
    saw_result = False
    for i, turn in enumerate(turns):
        saw_result = saw_result or turn.attempts[-1].tool_results > 0
        out.append(TurnFacts(delivered(turns, i), saw_result, i == last, i < last and _rejected(turn, turns[i + 1]),
                             i == last_tools))
    return out


def _rejected(turn: Turn, after: Turn) -> bool:
    """Whether the harness could not use `turn`'s reply, by the next turn of its episode: the request
    says so, or asks exactly what `turn` asked (dspy's fallback format after fields it could not parse)."""
    head = after.attempts[0]
    return head.rejects or (head.state_hash is not None and head.state_hash == turn.attempts[-1].state_hash)


def episode_expectation(run: str, ep: Episode, rules: Sequence[Rule]) -> tuple[dict, str | None]:
    """(the tags an expectation rule sees for the episode, what it expects: call, none or None)."""
    first = ep.turns[0].attempts[0]
    tags = match_tags(first.tags, run=run, episode=ep.name, item=ep.item_key, category=ep.category,
                      condition=first.condition)
    return tags, expectation(tags, rules)


# One fetch of many runs' attempts (runs are batched up to about this many attempts) instead of a
# query per run: a run's query scans the whole table, and building rows out of it is per-row work.
_BATCH_ATTEMPTS = 200_000

# Per run: its attempts and how many replicas (hosts, so clocks) recorded them, from their
# segments' names.
_RUN_SIZES_SQL = """
SELECT run, sum(n), count(DISTINCT regexp_extract(segment, $pattern, 1))
FROM (SELECT run, segment, count(*) AS n FROM exchanges
      WHERE is_attempt AND run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run, segment)
GROUP BY run
"""

# The attempts of a batch of runs, in clock order per run, column by column (see Attempt). parent_hashes
# come as one space-separated string (hex hashes), which is much cheaper to fetch than a list, and
# only where build_episodes reads them: untagged attempts, and every attempt of a run several clocks
# recorded (causal_order).
_ATTEMPTS_SQL = """
SELECT run, id, episode, item, json_extract_string(tags, '$.category'), condition, outcome, sub_kind,
       coalesce(harness_saw_prose, false), state_hash, chain_hash,
       CASE WHEN episode IS NULL OR run IN (SELECT unnest($clocks::VARCHAR[]))
            THEN array_to_string(coalesce(parent_hashes, []), ' ') END,
       item_hash, call_signature, tags::VARCHAR, coalesce(tool_results, 0),
       CASE WHEN episode IS NULL OR run IN (SELECT unnest($clocks::VARCHAR[]))
            THEN array_to_string(coalesce(reply_keys, []), ' ') END,
       coalesce(rejects, false), tool_set IS NOT NULL
FROM exchanges WHERE is_attempt AND run IN (SELECT unnest($runs::VARCHAR[])) ORDER BY run, started_at, id
"""

# _ATTEMPTS_SQL's columns are run, then Attempt's fields in order; the key lists come as one string each.
_KEY_LISTS = [1 + [f.name for f in dataclasses.fields(Attempt)].index(name) for name in ("parent_hashes", "reply_keys")]

# What derive() computes of a turn in Python; the rest (_TURNS_SQL) is its final attempt's.
_TURN_ROW = ["turn_id", "run", "episode_key", "turn_index", "item_key", "category", "n_attempts", "final_exchange_id",
             "expect", *TurnFacts._fields]
_FROM_FINAL = {
    "condition": "e.condition", "model": "e.model", "outcome": "e.outcome", "sub_kind": "e.sub_kind",
    "surface": "e.surface", "n_calls": "coalesce(e.n_calls, 0)", "finish_reason": "e.finish_reason",
    "harness_saw_prose": "coalesce(e.harness_saw_prose, false)", "content": "e.content",
    "offered_tools": "e.tool_set IS NOT NULL", "tool_results": "coalesce(e.tool_results, 0)",
    "finishes": "coalesce(e.finishes, false)", "protocol": "e.protocol", "finisher": "e.finisher",
}
_TURNS_SQL = f"""
INSERT INTO turns ({", ".join(TURNS.names)})
SELECT {", ".join(f"({ROLE_SQL})" if n == "role" else "$version" if n == "analyzer_version" else n for n in TURNS.names)}
FROM (SELECT {", ".join(f"t.{n}" for n in _TURN_ROW)}, {", ".join(f"{sql} AS {n}" for n, sql in _FROM_FINAL.items())}
      FROM _turn_rows t JOIN exchanges e ON e.id = t.final_exchange_id ORDER BY t.rowid)
"""
assert set(_TURN_ROW) | set(_FROM_FINAL) | {"role", "analyzer_version"} == set(TURNS.names)
_RUNS_SQL = """
INSERT INTO runs
WITH ex AS (
    SELECT run,
           count(*) AS n_exchanges,
           min(started_at) AS first_seen,
           max(coalesce(ended_at, started_at)) AS last_seen,
           mode(model) FILTER (WHERE is_attempt) AS model,
           string_agg(DISTINCT condition, ',' ORDER BY condition) FILTER (WHERE is_attempt) AS condition,
           mode(stack_marker) AS marker,
           mode(stack_marker_version) AS marker_version,
           mode(upstream) AS upstream
    FROM exchanges WHERE run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run
),
fp_run AS (
    SELECT run, arg_max(stack, recorded_at) AS stack, arg_max(stack_version, recorded_at) AS version
    FROM fingerprints WHERE run IS NOT NULL GROUP BY run
),
fp_up AS (
    SELECT upstream, arg_max(stack, recorded_at) AS stack, arg_max(stack_version, recorded_at) AS version
    FROM fingerprints WHERE upstream IS NOT NULL GROUP BY upstream
)
SELECT ex.run,
       coalesce(fp_run.stack, fp_up.stack, ex.marker),
       CASE WHEN fp_run.stack IS NOT NULL THEN fp_run.version
            WHEN fp_up.stack IS NOT NULL THEN fp_up.version
            ELSE ex.marker_version END,
       ex.model, ex.condition, ex.n_exchanges,
       (SELECT count(*) FROM episodes e WHERE e.run = ex.run),
       (SELECT count(*) FROM turns t WHERE t.run = ex.run),
       ex.first_seen, ex.last_seen, $version
FROM ex LEFT JOIN fp_run ON fp_run.run = ex.run LEFT JOIN fp_up ON fp_up.upstream = ex.upstream
"""


def derive(con, runs: Iterable[str], rules: Sequence[Rule] | None = None, progress=None) -> dict[str, int]:
    """Rebuild turns, episodes and runs rows for these runs from their exchanges (idempotent).

    `rules`: expectation rules (analysis.measure.expectations); None uses the ones stored with the analysis.
    `progress` (toolproxy.term.progress.Progress): told the number of runs, advanced per run.

    Python does only what is sequential (grouping attempts into turns and episodes, loops,
    expectations); statements run per batch of runs, not per run, and what a turn copies from its
    final attempt is joined in SQL.
    """
    with gc_paused():
        return _derive(con, runs, rules, progress)


def _derive(con, runs: Iterable[str], rules: Sequence[Rule] | None, progress) -> dict[str, int]:
    from toolproxy.analysis.lifecycle.reanalyze import stored_rules
    from toolproxy.analysis.store.connection import insert_columns
    # Here, not at the top: the live page's classifier imports this module for per-record work,
    # and the writer module brings the spill cipher (cryptography) and asyncio with it.
    from toolproxy.record.writer import SEGMENT_REPLICA

    if rules is None:
        rules = stored_rules(con)
    runs = sorted(set(runs))
    totals = {"turns": 0, "episodes": 0}
    if not runs:
        return totals
    con.execute("CREATE TEMP TABLE IF NOT EXISTS _turn_map (id VARCHAR, turn_id VARCHAR)")
    con.execute(f"CREATE TEMP TABLE IF NOT EXISTS _turn_rows ({', '.join(f'{n} {TURNS.types[n]}' for n in _TURN_ROW)})")
    con.execute("DELETE FROM turns WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs])
    con.execute("DELETE FROM episodes WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs])
    con.execute("DELETE FROM runs WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs])
    sizes = {run: (n, replicas) for run, n, replicas in con.execute(_RUN_SIZES_SQL, {"pattern": SEGMENT_REPLICA, "runs": runs}).fetchall()}
    clocks = [run for run in runs if sizes.get(run, (0, 0))[1] > 1]
    if progress is not None:
        progress.total = len(runs)
    batch: list[str] = []
    size = 0
    for k, run in enumerate(runs):
        batch.append(run)
        size += sizes.get(run, (0, 0))[0]
        if size < _BATCH_ATTEMPTS and k + 1 < len(runs):
            continue
        turn_rows, episode_cols, map_ex, map_turn = _derive_batch(con, batch, clocks, rules, progress)
        totals["turns"] += insert_columns(con, "_turn_rows", dict(zip(_TURN_ROW, turn_rows)), {n: TURNS.types[n] for n in _TURN_ROW})
        totals["episodes"] += EPISODES.insert(con, episode_cols)
        insert_columns(con, "_turn_map", {"id": map_ex, "turn_id": map_turn}, {"id": "VARCHAR", "turn_id": "VARCHAR"})
        batch, size = [], 0
    con.execute(_TURNS_SQL, {"version": ANALYZER_VERSION})
    con.execute("UPDATE exchanges SET turn_id = m.turn_id, analyzer_version = $v FROM _turn_map m WHERE exchanges.id = m.id",
                {"v": ANALYZER_VERSION})
    con.execute("UPDATE calls SET turn_id = m.turn_id, analyzer_version = $v FROM _turn_map m WHERE calls.exchange_id = m.id",
                {"v": ANALYZER_VERSION})
    con.execute("DELETE FROM _turn_map")
    con.execute("DELETE FROM _turn_rows")
    con.execute(_RUNS_SQL, {"runs": runs, "version": ANALYZER_VERSION})
    return totals


# Attempt columns whose values repeat along a run (its name, an episode's tags, an outcome...):
# one string object per distinct value instead of one per attempt (share_strings). A run is held whole while its
# episodes are grouped, so this is most of what an attempt costs in memory.
_REPEATING = frozenset(("run", "episode", "item", "category", "condition", "outcome", "sub_kind", "tags"))
_ATTEMPT_COLUMNS = ["run", *(f.name for f in dataclasses.fields(Attempt))]


def _columns(arrays: dict) -> list[Sequence]:
    """_ATTEMPTS_SQL's result as lists, each array let go once converted."""
    out = []
    for name, key in zip(_ATTEMPT_COLUMNS, list(arrays), strict=True):
        values = arrays.pop(key).tolist()
        out.append(share_strings(values) if name in _REPEATING else values)
    return out


def _derive_batch(con, runs: list[str], clocks: list[str], rules: Sequence[Rule], progress):
    """The turn rows (columns of _TURN_ROW), episode columns and attempt -> turn map of a batch of runs."""
    cols = _columns(con.execute(_ATTEMPTS_SQL, {"runs": runs, "clocks": clocks}).fetchnumpy())
    run_of = cols[0]
    for k in _KEY_LISTS:
        cols[k] = [[] if p is None else p.split() for p in cols[k]]
    attempts = list(map(Attempt, *cols[1:]))
    spans: dict[str, tuple[int, int]] = {}
    start = 0
    for end in range(1, len(run_of) + 1):
        if end == len(run_of) or run_of[end] != run_of[start]:
            spans[run_of[start]] = (start, end)
            start = end
    turn_rows: list[tuple] = []
    episode_rows: list[tuple] = []
    map_ex: list[str] = []
    map_turn: list[str] = []
    clocked = set(clocks)
    categories: dict[tuple, str | None] = {}  # category_of(item, tag), which repeats along an episode
    for run in runs:
        start, end = spans.get(run, (0, 0))
        for ep in build_episodes(run, attempts[start:end], one_clock=run not in clocked):
            tags, expect = episode_expectation(run, ep, rules)
            for i, (turn, facts) in enumerate(zip(ep.turns, turn_facts(ep.turns))):
                head = turn.attempts[0]
                tid = head.id
                item = head.item or ep.item_key
                key = (item, head.category)
                if key not in categories:
                    categories[key] = category_of(*key)
                turn_rows.append((tid, run, ep.key, i, item, categories[key] or ep.category, len(turn.attempts),
                                  turn.attempts[-1].id, expect, *facts))
                if len(turn.attempts) == 1:
                    map_ex.append(tid)
                    map_turn.append(tid)
                else:
                    for a in turn.attempts:
                        map_ex.append(a.id)
                        map_turn.append(tid)
            episode_rows.append((ep.key, run, ep.name, ep.reconstructed, ep.item_key, ep.category, len(ep.turns),
                                 ep.looping, ep.loop_reason, expect,
                                 orjson.dumps({k: v for k, v in tags.items() if v is not None}).decode(), ANALYZER_VERSION))
        if progress is not None:
            progress.advance()
    turn_cols = [list(c) for c in zip(*turn_rows)] or [[] for _ in _TURN_ROW]
    episode_cols = dict(zip(EPISODES.names, [list(c) for c in zip(*episode_rows)] or [[] for _ in EPISODES.names]))
    return turn_cols, episode_cols, map_ex, map_turn
