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
from typing import Any, Iterable, NamedTuple, Sequence

import orjson

from toolproxy.analysis.ingest import harnesses
from toolproxy.analysis.ingest.echoes import echoed_calls

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
