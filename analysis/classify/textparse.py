"""toolproxy.calls.parse_text, remembered per process by (text, offered names).

The analyzer parses the same texts for calls again and again, at tens to hundreds of
microseconds each: a looping agent, a harness retrying, or the same item run again at
temperature 0 gets the same reply text (classify), and a harness resends the reply in its next
request, where echoes looks for the calls in it again. Results are immutable (their argument
values are only read). Short texts only, so the memo stays a few MB.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolproxy.calls import TextParse, parse_text

_PARSES: dict[tuple[str, tuple[str, ...]], TextParse] = {}
_CACHED_TEXT_LEN = 4096
_MAX_ENTRIES = 2048


def parsed_text(text: str, names: Sequence[str]) -> TextParse:
    """parse_text(text, tool_names=names): it reads the names as a set, so any order gives the
    same result (the same order, as classify and echoes both pass the tool set's list, hits)."""
    if len(text) > _CACHED_TEXT_LEN:
        return parse_text(text, tool_names=names)
    key = (text, tuple(names))
    hit = _PARSES.get(key)
    if hit is None:
        if len(_PARSES) >= _MAX_ENTRIES:
            _PARSES.clear()
        hit = _PARSES[key] = parse_text(text, tool_names=names)
    return hit
