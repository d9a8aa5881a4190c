"""Bodies cut into content-addressed pieces, for `export --layout pieces`.

An agent's every request resends its whole conversation, so exporting each body whole grows with
the square of an episode's length. Cut at the end of each object or array element of the
top-level object's arrays (each message of `messages`, each tool of `tools`, each choice of a
reply; scalars such as a prompt's token ids stay together, a hash each would outweigh them), a body is a few
pieces that an episode's later requests share, and each piece is stored once. The separator before
an element travels with it (`,{"role":...}`), so a message reads the same in every request that
repeats it, and the pieces of a body concatenated are its recorded text exactly: the cut is made on
the recorded characters, never on a re-serialisation, whatever their whitespace or key order.

A body that is not a JSON object, or not text as recorded (base64), is one piece.
"""

from __future__ import annotations

import hashlib
import re

import orjson

# Between these, nothing changes the nesting: scalars, commas, colons, whitespace.
_STRUCTURAL = re.compile(r'["\[\]{}]')
_STRING_END = re.compile(r'["\\]')
_SPACE = " \t\n\r"


def piece_hash(text: str) -> str:
    """The piece's key: the SHA-256 of its UTF-8 bytes, as DuckDB's sha256(text) gives it."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def split(text: str | None, encoding: str | None) -> list[dict] | None:
    """The body's pieces in order, each {"h": hash, "t": text}; None for no body."""
    if text is None:
        return None
    cuts = _cuts(text) if encoding == "utf8" else []
    bounds = [0, *cuts, len(text)]  # an object ends after its last element, so no piece is empty but of ""
    return [{"h": piece_hash(t), "t": t} for t in (text[a:b] for a, b in zip(bounds, bounds[1:]))]


def _cuts(text: str) -> list[int]:
    """Where each object or array element of the top-level object's arrays ends; [] when it is not one."""
    try:
        if not isinstance(orjson.loads(text), dict):
            return []
    except orjson.JSONDecodeError:
        return []
    # valid JSON from here: the scanner only has to find where values end, not check them
    cuts: list[int] = []
    i = _skip_space(text, text.index("{") + 1)
    while text[i] != "}":
        i = _skip_space(text, _string_end(text, i + 1))  # the key, then ':'
        i = _skip_space(text, i + 1)
        if text[i] == "[":
            i = _skip_space(text, i + 1)
            while text[i] != "]":
                container = text[i] in "[{"
                i = _value_end(text, i)
                if container:  # a scalar (a token id of a prompt) is too small to pay for its own hash
                    cuts.append(i)
                i = _skip_space(text, i)
                if text[i] == ",":
                    i = _skip_space(text, i + 1)
            i += 1
        else:
            i = _value_end(text, i)
        i = _skip_space(text, i)
        if text[i] == ",":
            i = _skip_space(text, i + 1)
    return cuts


def _skip_space(text: str, i: int) -> int:
    while text[i] in _SPACE:
        i += 1
    return i


def _string_end(text: str, i: int) -> int:
    """Just past the string whose opening quote is before i."""
    while True:
        m = _STRING_END.search(text, i)
        if m.group() == '"':
            return m.end()
        i = m.end() + 1  # the escaped character


def _value_end(text: str, i: int) -> int:
    """Just past the value starting at i."""
    c = text[i]
    if c == '"':
        return _string_end(text, i + 1)
    if c not in "[{":
        while i < len(text) and text[i] not in ",]}" + _SPACE:
            i += 1
        return i
    depth = 0
    while True:
        m = _STRUCTURAL.search(text, i)
        c, i = m.group(), m.end()
        if c == '"':
            i = _string_end(text, i)
        elif c in "[{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return i
