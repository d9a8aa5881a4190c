"""Untrusted text made safe to print on a terminal.

Model output, request paths, header values and file names are written by someone else. Printed
raw, an escape sequence in them clears the screen, retitles the window, hides lines or rewrites
what was printed before (ESC, CSI, OSC, the C1 controls some terminals obey, a carriage return),
and a bidi override makes text read in another order than it is stored. Every command that shows
such text passes it through `printable`, which replaces those characters with a visible escape.
Only the display changes: the data stays as it was, and a JSON document passed through it stays
valid JSON that decodes to the same strings (the escapes outside C0 are JSON's own \\uXXXX, and
C0 controls never appear raw in a JSON document).
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, bidi marks/embeddings/overrides/isolates, line and paragraph
# separators, and lone surrogates (undecodable bytes kept by Python's surrogateescape).
_OTHERS = r"\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_ONE_LINE = re.compile(r"[\x00-\x1f" + _OTHERS + "]")
_LINES = re.compile(r"[\x00-\x08\x0b-\x1f" + _OTHERS + "]")  # tab and newline kept
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every character that could act on a terminal shown as an escape (ESC -> \\x1b).

    lines=True keeps newlines and tabs, for multi-line output; otherwise they are escaped too, so
    one value stays on one line (a log line, a table cell).
    """
    return (_LINES if lines else _ONE_LINE).sub(_escape, text)
