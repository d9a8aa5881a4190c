"""Conversation keys: canonical hashes of a request's messages, computed once per exchange.

Episodes are reconstructed by message-prefix chaining (analysis.episodes.build): a later request
whose message list starts with an earlier request's messages plus the reply it got continues that
episode. Everything keyed on conversation content uses the hashes computed here, at ingest (the
per-record stage stores them on the exchange), so re-deriving a run reads small columns, not
bodies: the state of the conversation, the chain key a continuing request names, the echo keys of
harnesses that resend a call as text, and the keys of requests that dropped or rewrote a reply.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import orjson

from toolproxy.analysis.classify import harnesses
from toolproxy.analysis.classify.echoes import echoed_calls

UNTAGGED_RUN = "(untagged)"
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
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ).strip()
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


def _named(value: Any, names: frozenset[str]) -> bool:
    """`value in names` for a value the request wrote: a role or part type may be any JSON (a list
    is not hashable, so `in` on a set would raise and the exchange be set aside)."""
    return type(value) is str and value in names


def _is_tool_result(role: Any, content: Any, text: str) -> bool:
    """Whether a message (its role, content and _text of it) returns a tool's result to the
    model, in any of the ways harnesses write it."""
    if _named(role, _RESULT_ROLES):
        return True
    if isinstance(content, list) and any(isinstance(p, dict) and _named(p.get("type"), _RESULT_PARTS) for p in content):
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
    prior_hash: str | None
    prefix_links: list[str]
    thread: str | None


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
    prefixes: Prefixes | None = None,
    scope: str | None = None,
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
      read whole). Then come the rolling hashes after each earlier assistant message, longest
      first, which are not stored here but walked (parent_walk): prior_hash is the first of them,
      and prefix_links lead from each to the one before it.
    item_hash: messages + offered tool names, for pairing the same item across runs.
    tool_results: how many messages return a tool's result to the model (see _is_tool_result).
    reply_keys: the keys beside chain_hash that a later request names this reply by: its ids key
      (the reply's call ids, `reply_ids`: what tells identical conversations apart), its tail key,
      and, when `reply_unread` (a call's arguments did not parse, so the reply's canonical form may
      not be the one the harness writes back: dspy repairs the JSON), the unread keys of this
      request and of its tail.
    rejects: the messages after the last assistant message say the harness could not use the reply
      before them (analysis.classify.harnesses).
    asks_again: the request may be the one before it asked again in the harness's fallback format
      (analysis.classify.protocols.Reading.fallback): its own state's request key is tried first, so it
      continues the turn that asked the same (turn_facts then reads that turn as rejected).
    prior_hash: the rolling hash after the assistant message before the last one.
    prefix_links: (hash, the hash before it) pairs, flattened, of this request's rolling hashes
      after its assistant messages, but for those the request its walk resumed already gave:
      storing every earlier hash with every request was the square of an episode's length.
    prefixes: walks of earlier requests to resume (Prefixes), within `scope`; each request's
      prefix_links are then only the ones its own messages add (see Prefixes).
    thread: thread_key of the messages.
    """
    found, state, start = prefixes.resume(messages, scope) if prefixes is not None else (None, None, 0)
    given = len(state[3]) if state is not None else 0  # links the resumed request gave already
    state = _walk(messages, start, state if state is not None else _fresh())
    if found is not None:
        prefixes.keep(found, len(messages), state)
    (
        running,
        tail,
        _,
        parents,
        results,
        block,
        block_calls,
        block_ids,
        block_prefix,
        block_tail,
        tail_parent,
        after,
        after_texts,
        _,
    ) = state
    links = [h for j in range(max(given, 1), len(parents)) for h in (parents[j], parents[j - 1])]
    prior = parents[-2] if len(parents) > 1 else None
    parents = parents[-1:]
    state_suffix = b"\x00state" + orjson.dumps([tool_set, model])
    dropped = []
    for prefix in reversed(after[:-1]):  # longest first; the whole list is this request's own state
        prefix = prefix.copy()
        prefix.update(state_suffix)
        dropped.append(request_key(prefix.hexdigest()))
    # Longest conversation first: every key that ends at the last assistant message (its exact
    # hash, then the same conversation as an echo or without its system prompt) comes before the
    # exact hash of any earlier one. An earlier one may name a turn another request continued
    # already (smolagents resends a call as text, which only its echo key matches, after a reply
    # it kept as it came), and the first key known decides.
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
        tail = tail.copy()
        tail.update(canon)
        reply_keys.append(tail.hexdigest())
    rejected = block_prefix is not None and harnesses.rejects(after_texts)
    return Keys(
        len(messages),
        state.hexdigest(),
        chain,
        dropped + parents,
        item.hexdigest(),
        results,
        reply_keys,
        rejected,
        prior,
        links,
        thread_key(messages),
    )


def thread_key(messages: Sequence[Any]) -> str | None:
    """A hash of the conversation's first message after its leading system ones, or None when it
    has none.

    Every other key hashes a prefix that holds that message: the rolling hash all of it, the tail
    hash everything after the leading system messages. So two requests whose thread keys differ
    share no key, and no attempt of one thread can continue or retry one of another: derive groups
    a run's threads apart (a batch at a time) and gets what grouping the run whole gives. A request
    without such a message (system messages only) names keys of conversations that start with its
    reply instead, so a run holding one is grouped whole."""
    for m in messages:
        if isinstance(m, dict) and not _named(role := m.get("role"), _SYSTEM_ROLES):
            content = m.get("content")
            text = content.strip() if type(content) is str else _text(content)
            calls = _message_calls(m) if m.get("tool_calls") else []
            return _digest(b"thread\x00" + _canon(role, text, calls)).hex()
    return None


def parent_walk(parents: Sequence[str], prior: str | None, links: dict[str, str]) -> Iterator[str]:
    """A request's parent keys in the order they are tried: its stored parent_hashes, then from
    its prior_hash back along `links` (every prefix_links pair of the attempts it may continue,
    as a dict) to its first assistant message. Stops after len(links) steps, so links that loop
    (which only colliding hashes could make) cannot hang it."""
    yield from parents
    steps = len(links)
    while prior is not None and steps >= 0:
        yield prior
        prior = links.get(prior)
        steps -= 1


def link_map(flattened: Iterable[Sequence[str]]) -> dict[str, str]:
    """The prefix_links of many requests (each flattened pairs) as one dict: hash -> the hash before it."""
    links: dict[str, str] = {}
    for pairs in flattened:
        if pairs:
            it = iter(pairs)
            links.update(zip(it, it))
    return links


# What conversation_keys knows after some of a request's messages (_walk): the running hash, the
# tail hash, whether only system messages came so far, the running hash after each assistant
# message, the tool results, the last run of consecutive assistant messages (its texts, calls and
# ids, the running and tail hashes before it), the tail hash after the last assistant message,
# the running hashes after each message since it (at most DROPPED_PREFIXES + 1) and their texts,
# and the last message's role. The hash objects in it are never updated once stored there, so a
# copy of the lists and of the two running hashes is a state of its own (_resumed).
_State = tuple


def _fresh() -> _State:
    # One running hash over the canonical messages (JSON arrays, so self-delimiting): a prefix's
    # hash is a copy of the running state, which keeps this linear in the conversation length.
    # The tail hash is the same without the leading system messages: a harness that swaps its
    # system prompt for another (smolagents' summary at max_steps, dspy's extract step) keeps the rest.
    return (
        hashlib.blake2b(digest_size=12),
        hashlib.blake2b(b"tail", digest_size=12),
        True,
        [],
        0,
        [],
        [],
        [],
        None,
        None,
        None,
        [],
        [],
        None,
    )


def _resumed(state: _State) -> _State:
    (
        running,
        tail,
        leading,
        parents,
        results,
        block,
        block_calls,
        block_ids,
        block_prefix,
        block_tail,
        tail_parent,
        after,
        after_texts,
        prev_role,
    ) = state
    return (
        running.copy(),
        tail.copy(),
        leading,
        parents[:],
        results,
        block[:],
        block_calls[:],
        block_ids[:],
        block_prefix,
        block_tail,
        tail_parent,
        after[:],
        after_texts[:],
        prev_role,
    )


def _walk(messages: Sequence[Any], start: int, state: _State) -> _State:
    """The state after messages[start:], from the state after messages[:start] (which it uses up)."""
    (
        running,
        tail,
        leading,
        parents,
        results,
        block,
        block_calls,
        block_ids,
        block_prefix,
        block_tail,
        tail_parent,
        after,
        after_texts,
        prev_role,
    ) = state
    update = running.update
    for i in range(start, len(messages)):
        m = messages[i]
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
            leading = leading and _named(role, _SYSTEM_ROLES)
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
                del after[: -DROPPED_PREFIXES - 1]
        else:
            role = None
            update(orjson.dumps([m]))
        prev_role = role
    return (
        running,
        tail,
        leading,
        parents,
        results,
        block,
        block_calls,
        block_ids,
        block_prefix,
        block_tail,
        tail_parent,
        after,
        after_texts,
        prev_role,
    )


class Prefixes:
    """The walks of recent requests' message lists, so that a request resending a conversation
    walks only the messages it adds: without them conversation_keys re-canonicalises every earlier
    message of every request, which is the square of an episode's length and was half of
    analyze's CPU on long agent episodes.

    A walk is resumed only where the request's messages serialise (orjson, so 1, 1.0 and true
    differ, as in the canonical form) to the same bytes the earlier request's did, so every key
    is the one a fresh walk gives. Walks are found by the request's first two messages (a system
    prompt and the task, which a conversation keeps); a few per such head are kept (the latest
    requests of conversations that begin alike, or the one before a reply the harness dropped),
    and the least recently used heads go once the serialised messages kept pass `budget` bytes.

    A request that resumes a walk stores only the prefix_links its own messages add, so the
    request it resumed must be stored beside it: walks are resumed only within a `scope` (a run's
    attempts, with or without an episode tag) and within what is stored together (one batch of one
    segment, which prune keeps or drops whole; a record set aside is never analysed, so never
    walked, and one whose analysis fails starts the batch's walks afresh: load.lines.analyze_lines)."""

    PER_HEAD = 4

    def __init__(self, budget: int = 64 << 20) -> None:
        self.budget = budget
        self.size = 0
        self.heads: OrderedDict[tuple, list[tuple[bytes, int, _State]]] = OrderedDict()

    def resume(self, messages: Sequence[Any], scope: Any = None) -> tuple[tuple, _State | None, int]:
        """(what keep needs, a state to resume and the messages it covers) for this request; no
        state when no kept walk of this scope is a prefix of it."""
        encoded = orjson.dumps(messages)
        head = (scope, orjson.dumps(messages[:2]))
        kept = self.heads.get(head)
        if kept is not None:
            self.heads.move_to_end(head)
            for body, n, state in kept:
                # body without its closing bracket, then the next element's comma or the end
                if encoded.startswith(body[:-1]) and encoded[len(body) - 1] in b",]":
                    return (head, encoded), _resumed(state), n
        return (head, encoded), None, 0

    def keep(self, found: tuple, n: int, state: _State) -> None:
        """Keep the walk of a whole request (its state after all n messages) for the next one."""
        head, encoded = found
        kept = self.heads.setdefault(head, [])
        if kept:
            self.heads.move_to_end(head)
        else:
            self.size += len(head[1])
        kept.insert(0, (encoded, n, state))
        self.size += len(encoded)
        for body, _, _ in kept[self.PER_HEAD :]:
            self.size -= len(body)
        del kept[self.PER_HEAD :]
        while self.size > self.budget and self.heads:
            old_head, old = self.heads.popitem(last=False)
            self.size -= len(old_head[1]) + sum(len(body) for body, _, _ in old)


def _call_ids(m: dict) -> list[str]:
    """The ids of a chat message's tool calls (the stack made them up per reply, so they tell apart
    identical conversations running at the same time)."""
    return [
        tc["id"]
        for tc in m.get("tool_calls") or ()
        if isinstance(tc, dict) and isinstance(tc.get("id"), str) and tc["id"]
    ]


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
    structured calls, else for every reading of calls re-serialised in its text (analysis.classify.echoes).

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
