"""parse_text: run every format family over a text and keep the calls in position order.

Families run from the most specific syntax to the least: marker formats first, then fenced JSON,
then bare JSON in prose. A later family never takes text an earlier one claimed, so the JSON
inside `<tool_call>...</tool_call>` is one Hermes call, not also a bare one.

Hot-path safety: the text condition calls this on every model reply, so a family that fails on
some unforeseen input contributes nothing instead of failing the request (the fuzz tests run the
families unguarded, so such a failure is still caught in CI)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Collection

import toolproxy.calls.functiongemma as functiongemma
import toolproxy.calls.jsonblocks as jsonblocks
import toolproxy.calls.mistral as mistral
import toolproxy.calls.pythonic as pythonic
import toolproxy.calls.tagged as tagged
from toolproxy.runtime.gcpause import gc_paused

from .functiongemma import find_functiongemma
from .jsonblocks import find_bare, find_fenced
from .jsontext import respan
from .mistral import find_mistral
from .model import FORMATS, Group, TextCall, TextParse
from .pythonic import find_bare_pythonic, find_python_tag, find_wrapped_pythonic
from .tagged import find_hermes, find_lmstudio, find_qwen_xml

Finder = Callable[..., list[Group]]

# (finder, the formats its calls can have), in claiming order.
FINDERS: tuple[tuple[Finder, frozenset[str]], ...] = (
    (find_hermes, frozenset({"hermes", "qwen_xml"})),
    (find_lmstudio, frozenset({"lmstudio", "qwen_xml"})),
    (find_mistral, frozenset({"mistral"})),
    (find_functiongemma, frozenset({"functiongemma"})),
    (find_python_tag, frozenset({"python_tag"})),
    (find_wrapped_pythonic, frozenset({"pythonic"})),
    (find_qwen_xml, frozenset({"qwen_xml"})),
    (find_fenced, frozenset({"fenced_json"})),
    (find_bare_pythonic, frozenset({"pythonic"})),
    (find_bare, frozenset({"bare_json", "llama_json"})),
)

# format -> the strings its call syntax can start with, as each family module declares them.
START_MARKERS: dict[str, tuple[str, ...]] = {}
for _module in (tagged, mistral, functiongemma, pythonic, jsonblocks):
    for _format, _markers in _module.MARKERS.items():
        START_MARKERS[_format] = tuple(dict.fromkeys(START_MARKERS.get(_format, ()) + _markers))


_ALL_FORMATS = frozenset(FORMATS)
# family -> the characters its call syntax can start with (first characters of its formats'
# markers): a text holding none of them cannot give that family a group, so it is not run.
# Most replies are prose without any of them, and then no family runs at all.
_LEADS: dict[Finder, frozenset[str]] = {
    finder: frozenset(m[0] for f in produces for m in START_MARKERS[f]) for finder, produces in FINDERS
}
_ANY_LEAD = frozenset().union(*_LEADS.values())


def start_markers(formats: Collection[str] | None = None) -> tuple[str, ...]:
    """Every string a call in one of these formats (all when None) can start with: a streaming
    reader can show text up to the first of them and must hold back from there on."""
    wanted = _formats(formats)
    return tuple(sorted({m for f, ms in START_MARKERS.items() if f in wanted for m in ms}))


_SEPARATOR = re.compile(r"[\s;,]*")
_EMPTY_FENCE = re.compile(r"```[\w+\-]*[ \t]*\r?\n?\s*```")


class _Claims:
    """Accepted spans, sorted and disjoint."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def overlaps(self, start: int, end: int) -> bool:
        k = bisect.bisect_right(self.starts, start)
        if k and self.ends[k - 1] > start:
            return True
        return k < len(self.starts) and self.starts[k] < max(end, start + 1)

    def add(self, start: int, end: int) -> None:
        k = bisect.bisect_right(self.starts, start)
        self.starts.insert(k, start)
        self.ends.insert(k, end)

    def covering(self, i: int) -> int | None:
        """End of the accepted span that contains i, if any."""
        k = bisect.bisect_right(self.starts, i)
        return self.ends[k - 1] if k and self.ends[k - 1] > i else None


def parse_text(
    text: str,
    *,
    tool_names: Collection[str] | None = None,
    formats: Collection[str] | None = None,
) -> TextParse:
    """Every tool call written as text, in position order. Calls to names that are not offered
    are kept (that is what the analyzer counts as hallucinated); `tool_names` only settles
    ambiguous bare JSON such as `{"name": "get_time"}` with no arguments key. `formats`
    restricts which syntaxes are recognised; an unknown format name is a ValueError."""
    wanted = _formats(formats)
    if not isinstance(text, str) or not text:
        return TextParse((), False, text.strip() if isinstance(text, str) else "")
    present = {ch for ch in _ANY_LEAD if ch in text}
    if not present:
        return TextParse((), False, text.strip())
    names = frozenset(tool_names) if tool_names is not None else None
    claims = _Claims()
    groups: list[Group] = []
    # A text of thousands of call markers builds a few objects per marker; see toolproxy.runtime.gcpause.
    with gc_paused():
        for finder, produces in FINDERS:
            if present.isdisjoint(_LEADS[finder]) or (wanted is not _ALL_FORMATS and not produces & wanted):
                continue
            for group in _run(finder, text, names, claims):
                calls = tuple(c for c in group.calls if c.format in wanted)
                if calls and not claims.overlaps(*group.span):
                    claims.add(*group.span)
                    groups.append(Group(group.span, _stretch(calls, group.span)))
        groups.sort(key=lambda g: g.span)
        calls = tuple(c for g in groups for c in g.calls)
        return TextParse(calls, bool(calls), _content(text, groups))


def _stretch(calls: tuple[TextCall, ...], span: tuple[int, int]) -> tuple[TextCall, ...]:
    """Make the calls of a group cover its markers and tags: the first call starts where the
    group starts, the last ends where it ends (a lone call gets the whole group span)."""
    first, last = calls[0], calls[-1]
    if len(calls) == 1:
        return calls if first.span == span else (respan(first, *span),)
    out = list(calls)
    out[0] = respan(first, span[0], first.span[1])
    out[-1] = respan(last, last.span[0], span[1])
    return tuple(out)


def _formats(formats: Collection[str] | None) -> frozenset[str]:
    if formats is None:
        return _ALL_FORMATS
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown call format(s) {', '.join(unknown)}; known: {', '.join(FORMATS)}")
    return frozenset(formats)


def _run(finder: Finder, text: str, names, claims: _Claims) -> list[Group]:
    try:
        if finder is find_bare:
            return finder(text, names, claims.covering)
        return finder(text, names)
    except Exception:  # noqa: BLE001 - see the module docstring: the hot path must not fail
        return []


def _content(text: str, groups: list[Group]) -> str:
    """The text without the call spans; separators between two adjacent calls go too."""
    if not groups:
        return text.strip()
    pieces: list[str] = []
    pos = 0
    for index, group in enumerate(groups):
        start, end = group.span
        between = text[pos:start]
        if index and _SEPARATOR.fullmatch(between):
            between = ""
        pieces.append(between)
        pos = max(pos, end)
    pieces.append(text[pos:])
    return _EMPTY_FENCE.sub("", "".join(pieces)).strip()
