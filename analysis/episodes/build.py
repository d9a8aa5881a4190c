"""Attempts -> turns -> episodes: a run's attempts grouped into episodes of turns.

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

import re
from collections import deque
from collections.abc import Iterable, Sequence

import orjson

from toolproxy.analysis.classify.expectations import ExpectationRule, expectation
from toolproxy.analysis.classify.keys import link_map, parent_walk
from toolproxy.analysis.classify.outcomes import NON_RESPONSE
from toolproxy.analysis.episodes.loops import mark_loops
from toolproxy.analysis.episodes.model import Attempt, Episode, Turn
from toolproxy.analysis.episodes.order import causal_order, chain_keys

_SEP = re.compile(r"[_-]")
# Turns one key names beyond which taking the oldest off the front of a list costs more than a deque.
_MANY = 32


def category_of(item_key: str | None, tag: str | None) -> str | None:
    """The `category` tag, else the item key's prefix before the first `_` or `-` (BFCL `simple_12`)."""
    if tag:
        return tag
    if not item_key or item_key.startswith("h:"):
        return None
    parts = _SEP.split(item_key, 1)
    return parts[0] if len(parts) == 2 and parts[0] else None


def build_episodes(
    run: str, attempts: Iterable[Attempt], one_clock: bool = False, placed: dict[str, tuple[str, str]] | None = None
) -> list[Episode]:
    """Group one run's attempts (given in clock order) into episodes of turns. Unless one clock
    stamped them all (one host: its clock order is the conversations' order), they are first put
    in causal_order.

    Several episodes may be open on the same conversation at once (a benchmark's epochs, threads
    asking one question): every key names all the turns it was given by, and a request continues
    the first of them, in clock order, that is still its episode's last turn. The keys that tell
    such copies apart (the ids of the calls a reply made) come first in a request's parents, so a
    copy follows its own reply; copies that nothing tells apart are still each continued once. The
    first key a request names that any turn was given by decides: when all its turns were
    continued already, the request starts an episode of its own (the same step taken again).

    `placed`: untagged attempts already grouped (attempt id -> its episode's name and its turn's
    first attempt id), which go where they are instead of being chained again, so that attempts
    after them chain as they would among all of the run's attempts (derive_changes)."""
    episodes: dict[str, Episode] = {}
    owner: dict[int, Episode] = {}  # id(turn) -> its episode
    # Most keys name one turn: their turns are a list (88 bytes, where a deque is 624 and five per
    # attempt were most of a run's memory while it was grouped), a deque once they are many.
    by_chain: dict[str, list[Turn] | deque[Turn]] = {}
    by_state: dict[str, list[Turn] | deque[Turn]] = {}  # turns whose last attempt failed, by their request's state
    threads: dict[str, list[Episode]] = {}  # the reconstructed episodes of each conversation (keys.thread_key)

    def is_open(turn: Turn) -> bool:
        return owner[id(turn)].turns[-1] is turn

    def oldest(queue: list[Turn] | deque[Turn], usable) -> Turn | None:
        while queue and not usable(queue[0]):  # a turn that stops being usable never is again
            if type(queue) is list:
                del queue[0]
            else:
                queue.popleft()
        return queue[0] if queue else None

    def add(table: dict, key: str, turn: Turn) -> None:
        queue = table.get(key)
        if queue is None:
            table[key] = [turn]
        else:
            queue.append(turn)
            if len(queue) == _MANY and type(queue) is list:
                table[key] = deque(queue)

    def retried(turn: Turn) -> bool:
        return turn.attempts[-1].outcome == NON_RESPONSE and is_open(turn)

    def retry_of(queue: list[Turn] | deque[Turn], a: Attempt) -> Turn | None:
        """The failed turn `a` asks again: the oldest still open whose request `a` repeats word for
        word, call ids included (identical conversations running at once each end their own turn),
        and whose failure `a` came after (a request that started before the failed one ended is
        another conversation's, not its retry). Times are compared only where one clock stamped
        them all: replicas' clocks disagree, and causal_order has put the attempts in order."""
        if oldest(queue, retried) is None:
            return None
        for turn in queue:
            f = turn.attempts[-1]
            if (
                retried(turn)
                and f.parent_hashes[:1] == a.parent_hashes[:1]
                and (not one_clock or f.ended is None or a.started is None or a.started >= f.ended)
            ):
                return turn
        return None

    def wrapped_up(a: Attempt) -> Episode | None:
        """A request that carries earlier turns but names none of them (a harness wrapping up under
        another system prompt and without tools, its calls rewritten as text: smolagents' summary
        at max_steps) goes on with the latest episode of its conversation (its thread) before it,
        when that one ran alone: every other episode of the thread had ended before it started.
        Episodes of one conversation that overlapped (identical tasks at once) leave it unplaced, and
        so does a run several clocks stamped (whether they overlapped cannot be told)."""
        if not one_clock or a.thread is None or a.started is None:
            return None
        here = []
        for ep in threads.get(a.thread, ()):
            first, last = ep.turns[0].attempts[0], ep.turns[-1].attempts[-1]
            if first.started is None or last.started is None:
                return None
            if last.started <= a.started:
                here.append((last.ended if last.ended is not None else last.started, first.started, ep))
        if not here:
            return None
        here.sort(key=lambda x: x[0])
        _, began, latest = here[-1]
        return latest if all(ended <= began for ended, _, _ in here[:-1]) else None

    def continued(a: Attempt) -> Episode | None:
        for h in parent_walk(a.parent_hashes, a.prior_hash, links):
            queue = by_chain.get(h)
            if queue is not None:
                parent = oldest(queue, is_open)
                return None if parent is None else owner[id(parent)]
        return None

    attempts = list(attempts)
    links = link_map(a.prefix_links for a in attempts)
    keys = None if one_clock else [chain_keys(a) for a in attempts]
    for i in range(len(attempts)) if keys is None else causal_order(attempts, keys, links):
        a = attempts[i]
        if a.episode is not None:
            key = f"{run}/{a.episode}"
            ep = episodes.get(key)
            if ep is None:
                ep = episodes[key] = Episode(key, a.episode, False)
            if (
                ep.turns
                and (final := ep.turns[-1].attempts[-1]).outcome == NON_RESPONSE
                and final.state_hash == a.state_hash
            ):
                ep.turns[-1].attempts.append(a)
            else:
                ep.turns.append(Turn([a]))
            continue
        failed = by_state.get(a.state_hash) if a.state_hash else None
        place = placed.get(a.id) if placed else None
        if place is not None:
            name, head = place
            ep = episodes.get(f"{run}/{name}")
            if ep is None:
                ep = episodes[f"{run}/{name}"] = Episode(f"{run}/{name}", name, True)
                if a.thread is not None:
                    threads.setdefault(a.thread, []).append(ep)
            turn = ep.turns[-1] if head != a.id else None  # a retry is its episode's last turn, as chaining found it
        else:
            turn = retry_of(failed, a) if failed else None
            ep = None if turn is not None else continued(a)
            if ep is None and turn is None and (a.parent_hashes or a.prior_hash):
                ep = wrapped_up(a)
        if turn is not None:
            turn.attempts.append(a)
        else:
            if ep is None:
                name = f"~{a.id}"
                ep = episodes[f"{run}/{name}"] = Episode(f"{run}/{name}", name, True)
                if a.thread is not None:
                    threads.setdefault(a.thread, []).append(ep)
            turn = Turn([a])
            ep.turns.append(turn)
            owner[id(turn)] = ep
        if a.outcome == NON_RESPONSE and a.state_hash and not (failed and failed[-1] is turn):
            add(by_state, a.state_hash, turn)
        named = owner[id(turn)].keys
        for key in chain_keys(a) if keys is None else keys[i]:
            add(by_chain, key, turn)
            named.append(key)
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


def match_tags(tags_json: str | None, **known: str | None) -> dict[str, str | None]:
    """The tags an expectation rule sees for an episode: its free tags plus the named ones."""
    free = orjson.loads(tags_json) if tags_json else {}
    if not isinstance(free, dict):
        free = {}
    return {str(k): v if v is None or isinstance(v, str) else str(v) for k, v in free.items()} | known


def episode_expectation(run: str, ep: Episode, rules: Sequence[ExpectationRule]) -> tuple[dict, str | None]:
    """(the tags an expectation rule sees for the episode, what it expects: call, none or None)."""
    first = ep.turns[0].attempts[0]
    tags = match_tags(
        first.tags, run=run, episode=ep.name, item=ep.item_key, category=ep.category, condition=first.condition
    )
    return tags, expectation(tags, rules)
