"""The loop every fixed-marker format shares: find each marker, read the call syntax after it up
to the next marker, continue after what was read."""

from __future__ import annotations

from collections.abc import Callable

from .model import Group


def each_marker(text: str, marker: str, read: Callable[[int, int, int], Group]) -> list[Group]:
    """read(start, body, limit): the group for the marker at start; body is just after the
    marker, limit is where the next marker (or the text) begins."""
    groups: list[Group] = []
    pos = 0
    while (start := text.find(marker, pos)) >= 0:
        body = start + len(marker)
        nxt = text.find(marker, body)
        group = read(start, body, nxt if nxt >= 0 else len(text))
        groups.append(group)
        pos = max(group.span[1], body)
    return groups
