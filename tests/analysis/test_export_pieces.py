"""`toolproxy export --layout pieces`: bodies cut into content-addressed pieces that rebuild the
recorded text byte for byte, with DuckDB's SQL alone, from real exported files."""

from __future__ import annotations

import json
import random

import pytest

from toolproxy.analysis.export.pieces import piece_hash, split


def _rebuilt(text: str, encoding: str = "utf8") -> list[str]:
    pieces = split(text, encoding)
    assert "".join(p["t"] for p in pieces) == text
    assert all(p["h"] == piece_hash(p["t"]) for p in pieces)
    return [p["t"] for p in pieces]


def test_a_chat_request_is_cut_after_each_message_and_tool():
    messages = [{"role": "system", "content": "be [brief], \"ok\" {}"}, {"role": "user", "content": "a\\"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    short = json.dumps({"model": "m", "messages": messages, "tools": tools, "stream": False})
    longer = json.dumps({"model": "m", "messages": messages + [{"role": "assistant", "content": "x"}], "tools": tools,
                         "stream": False})
    a, b = _rebuilt(short), _rebuilt(longer)
    assert len(a) == 4 and len(b) == 5
    assert a[:2] == b[:2] and a[2:] == b[3:]  # the longer request repeats every piece of the shorter one


@pytest.mark.parametrize("seed", range(20))
def test_any_whitespace_and_key_order_rebuilds_exactly(seed: int):
    rnd = random.Random(seed)
    value = {f"k{i}": rnd.choice([[{"a": [1, {"b": "]}\\\"["}], "c": None}] * rnd.randint(0, 3), "s\u00e9\U0001f642", 2.5e-3,
                                  [], {}, [[1, 2], [3]], True]) for i in range(rnd.randint(0, 6))}
    keys = list(value)
    rnd.shuffle(keys)
    text = json.dumps({k: value[k] for k in keys}, indent=rnd.choice([None, 0, 2, "\t"]), ensure_ascii=rnd.random() < 0.5,
                      separators=rnd.choice([None, (",", ":"), (" ,\n", " :  ")]))
    _rebuilt(" \r\n" * rnd.randint(0, 1) + text + "\n" * rnd.randint(0, 2))


@pytest.mark.parametrize("text, encoding", [
    ("", "utf8"), ("not json", "utf8"), ("[1, 2]", "utf8"), ('"s"', "utf8"), ('{"a": [1,', "utf8"),
    ('{"a": [1]} trailing', "utf8"), ("data: {\"a\": [1]}\n\n", "utf8"), ('{"a": [1, 2]}', "base64"),
    ("\ud800 lone surrogate", "utf8"),
])
def test_anything_else_is_one_piece(text: str, encoding: str):
    assert _rebuilt(text, encoding) == [text]
    assert split(None, None) is None
