"""parse_text never raises and stays fast: random slices and splices of the real examples,
random syntax soup, and 1 MB hostile inputs. The format families are also run unguarded here, so
an exception the hot-path guard in parse.py would swallow still fails the suite."""

import random

import pytest
from calls_examples import ROWS
from scaling import FACTOR, assert_scales_linearly

from toolproxy.calls import TextParse, parse_text
from toolproxy.calls.parse import FINDERS, _Claims

CORPUS = [row[1] for row in ROWS]
SOUP = list("{}[]()<>\"'\\:;,=\n `") + [
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<function=f>",
    "<parameter=p>",
    "</parameter>",
    "</function>",
    "```json\n",
    "```",
    "<start_function_call>",
    "call:f",
    "<escape>",
    "<end_function_call>",
    "[TOOL_REQUEST]",
    "[END_TOOL_REQUEST]",
    "<|python_tag|>",
    '"name"',
    '"arguments"',
    '"parameters"',
    "f(a=1)",
    "<function_calls>",
    "<|tool_call>",
    '<|"|>',
    "1e999",
    "NaN",
    "é",
    "\x00",
]


def _check(text: str) -> None:
    result = parse_text(text)
    assert isinstance(result, TextParse)
    assert isinstance(result.content, str)
    assert result.attempted == bool(result.calls)
    previous = -1
    for call in result.calls:
        start, end = call.span
        assert 0 <= start < end <= len(text)
        assert start >= previous
        previous = start
        assert call.name is None or isinstance(call.name, str)
        assert isinstance(call.raw_arguments, str)
        assert (call.arguments is None) == (call.error is not None)
    for finder, _ in FINDERS:
        args = (text, None, _Claims().covering) if finder.__name__ == "find_bare" else (text, None)
        for group in finder(*args):
            assert group.calls and 0 <= group.span[0] <= group.span[1] <= len(text)


def test_random_slices_of_real_examples():
    rng = random.Random(20260501)
    for _ in range(3000):
        text = rng.choice(CORPUS)
        a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        _check(text[a:b])


def test_random_splices_of_real_examples():
    rng = random.Random(7)
    for _ in range(1500):
        parts = []
        for _ in range(rng.randint(2, 5)):
            text = rng.choice(CORPUS)
            a = rng.randrange(len(text) + 1)
            parts.append(text[a : a + rng.randint(0, 120)])
        _check(rng.choice(["", "x ", "\n"]).join(parts))


def test_random_syntax_soup():
    rng = random.Random(99)
    for _ in range(2000):
        _check("".join(rng.choice(SOUP) for _ in range(rng.randint(0, 60))))


def test_every_truncation_of_every_example():
    for text in CORPUS:
        for cut in range(len(text) + 1):
            _check(text[:cut])


# Each input is one unit repeated: (unit, count), about 1 MB in all.
HOSTILE_UNITS = {
    "prose": ("The weather is fine today, thanks for asking. ", 23_000),
    "open_braces": ("{", 1_000_000),
    "nested_objects": ('{"name": ', 110_000),
    "nested_lists": ("[", 1_000_000),
    "unclosed_tool_calls": ("<tool_call>{", 90_000),
    "tool_call_markers": ("[TOOL_CALLS]", 85_000),
    "pythonic_openers": ("[f(", 330_000),
    "fence_openers": ("```json\n{", 100_000),
    "quotes_in_braces": ('{"', 500_000),
    "many_valid_calls": ('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>\n', 17_000),
    "many_bare_calls": ('{"name": "f", "arguments": {"a": 1}}; ', 28_000),
    "broken_bare_calls": ('{"name": "f", "arguments": {"a": \n', 30_000),
    "functiongemma_openers": ("<start_function_call>call:f{a:", 35_000),
    "qwen_xml_openers": ("<function=f><parameter=p>", 40_000),
}
HOSTILE = {kind: unit * count for kind, (unit, count) in HOSTILE_UNITS.items()}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_one_megabyte_inputs_finish_fast(kind):
    """No hostile shape makes the parser super-linear: 1 MB takes about 8x what 1/8 MB takes
    (measured in the same run, so a loaded machine slows both; see scaling.py)."""
    unit, count = HOSTILE_UNITS[kind]
    text, eighth = HOSTILE[kind], unit * (count // FACTOR)
    assert len(text) >= 900_000
    results = []
    ratio = assert_scales_linearly(
        lambda: parse_text(eighth), lambda: results.append(parse_text(text)), kind, max_references=200
    )
    assert all(isinstance(result, TextParse) for result in results)
    print(f"{kind}: {len(results[0].calls)} calls, {FACTOR}x the input took {ratio:.1f}x as long")


def test_many_valid_calls_are_all_found():
    assert len(parse_text(HOSTILE["many_valid_calls"]).calls) == 17_000
    assert len(parse_text(HOSTILE["many_bare_calls"]).calls) == 28_000
