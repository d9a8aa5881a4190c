"""Attempts in the order of their conversations, not their clocks (replicas' clocks may disagree)."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from toolproxy.analysis.classify.keys import EMPTY_ECHO, echo_key, link_map, parent_walk, request_key
from toolproxy.analysis.classify.outcomes import EMPTY_REPLIES, NON_RESPONSE
from toolproxy.analysis.episodes.model import Attempt


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


def causal_order(
    attempts: Sequence[Attempt], keys: Sequence[list[str]] | None = None, links: dict[str, str] | None = None
) -> list[int]:
    """The positions of the attempts (given in clock order: started_at, id) in an order that
    follows the conversations: every request after the turn whose reply it continues, and a turn's
    failed attempts before its answered one. `keys`: each attempt's chain_keys, if already known;
    `links`: link_map of the attempts' prefix_links, likewise.

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
    if links is None:
        links = link_map(a.prefix_links for a in attempts)
    providers: dict[str, list[int]] = {}  # key -> positions of the attempts it names, ascending
    for i, ks in enumerate(keys):
        for key in ks:
            providers.setdefault(key, []).append(i)
    edges: list[tuple[int, int]] = []  # (before, after)
    groups: dict[tuple, list[int]] = {}  # the attempts of one turn: retries of one request
    for i, a in enumerate(attempts):
        parent = None
        for h in parent_walk(
            a.parent_hashes, a.prior_hash, links
        ):  # longest first: the first one found is the turn it continues
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
