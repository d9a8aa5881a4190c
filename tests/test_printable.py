"""Untrusted text shown inert: a table of what each kind of character becomes."""

from __future__ import annotations

import json

import pytest

from toolproxy.proxy.logline import log_line
from toolproxy.record.model import Record
from toolproxy.term.printable import printable

CASES = [
    # (text, one line, lines=True)
    ("plain café 日本 🙂", "plain café 日本 🙂", "plain café 日本 🙂"),
    ("\x1b[2Jcleared", "\\x1b[2Jcleared", "\\x1b[2Jcleared"),
    ("\x1b]0;pwned\x07title", "\\x1b]0;pwned\\x07title", "\\x1b]0;pwned\\x07title"),
    ("\x9b2J c1 csi", "\\u009b2J c1 csi", "\\u009b2J c1 csi"),
    ("\x7f", "\\u007f", "\\u007f"),
    ("abc\u202egnp.exe", "abc\\u202egnp.exe", "abc\\u202egnp.exe"),
    ("\u2066iso\u2069\u200f", "\\u2066iso\\u2069\\u200f", "\\u2066iso\\u2069\\u200f"),
    ("a\nb\tc", "a\\nb\\tc", "a\nb\tc"),
    ("over\rwrite", "over\\rwrite", "over\\rwrite"),
    ("\x00nul", "\\x00nul", "\\x00nul"),
    ("caf\udce9", "caf\\udce9", "caf\\udce9"),  # an undecodable byte kept by surrogateescape
    ("line\u2028sep", "line\\u2028sep", "line\\u2028sep"),
    ("zero\u200dwidth joiner stays", "zero\u200dwidth joiner stays", "zero\u200dwidth joiner stays"),
]


@pytest.mark.parametrize("text,one_line,lines", CASES)
def test_printable(text, one_line, lines):
    assert printable(text) == one_line
    assert printable(text, lines=True) == lines
    assert printable(text).encode("utf-8")  # no lone surrogate left to crash an encoder


def test_json_stays_valid_and_decodes_to_the_same_strings():
    value = {"content": "".join(t for t, _, _ in CASES), "k\x1b": ["\x85", "\u202e"]}
    text = json.dumps(value, ensure_ascii=False, indent=2)
    assert json.loads(printable(text, lines=True)) == value


def test_serve_log_line_is_inert():
    rec = Record(
        id="x",
        started_at=0.0,
        method="GET",
        path="/v1/\x1b]0;owned\x07\x1b[2J",
        run="r\u202e1",
        status=404,
        duration_ms=1.0,
    )
    line = log_line(rec)
    assert line == "404 GET /v1/\\x1b]0;owned\\x07\\x1b[2J run=r\\u202e1 1ms"
