"""parse_text against real model output (rows and their sources in calls_examples.py)."""

import pytest
from calls_examples import ROWS

from toolproxy.calls import FORMATS, TextParse, parse_text


@pytest.mark.parametrize("row_id,text,expected,attempted,content", ROWS, ids=[r[0] for r in ROWS])
def test_real_examples(row_id, text, expected, attempted, content):
    result = parse_text(text)
    assert isinstance(result, TextParse)
    got = [(c.name, c.arguments, c.format) for c in result.calls]
    assert got == expected
    assert result.attempted is attempted
    if content is not None:
        assert result.content == content
    for call in result.calls:
        assert call.format in FORMATS
        assert (call.arguments is None) == (call.error is not None)
        start, end = call.span
        assert 0 <= start < end <= len(text)
    spans = [c.span for c in result.calls]
    assert spans == sorted(spans)


def test_row_ids_are_unique():
    ids = [r[0] for r in ROWS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    "text,tool_names,expected",
    [
        # Llama 3.2 sometimes drops "parameters" for a no-argument tool: only a known name makes it a call.
        ('{"name": "get_time"}', {"get_time"}, [("get_time", {}, "bare_json")]),
        ('{"name": "get_time"}', {"other"}, []),
        ('{"name": "get_time"}', None, []),
        # Qwen2.5-Coder puts the arguments beside the name inside a fence; a known name reads them so.
        (
            '```json\n{"name": "get_weather", "city": "Paris"}\n```',
            {"get_weather"},
            [("get_weather", {"city": "Paris"}, "fenced_json")],
        ),
        # tool_names never filters: a hallucinated name is reported.
        ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', {"get_weather"}, [("rm_rf", {}, "hermes")]),
    ],
)
def test_tool_names_decide_ambiguous_json_only(text, tool_names, expected):
    got = [(c.name, c.arguments, c.format) for c in parse_text(text, tool_names=tool_names).calls]
    assert got == expected


def test_raw_arguments_are_the_exact_source_slice():
    text = '<tool_call>{"name": "f", "arguments":  {"a" : 1,\n "b": [2, 3]} }</tool_call>'
    (call,) = parse_text(text).calls
    assert call.raw_arguments == '{"a" : 1,\n "b": [2, 3]}'
    assert call.span == (0, len(text))


def test_spans_cover_tags_and_partition_parallel_calls():
    text = 'ok [TOOL_CALLS]add{"a": 1}[TOOL_CALLS]mul{"a": 2} done'
    first, second = parse_text(text).calls
    assert text[slice(*first.span)] == '[TOOL_CALLS]add{"a": 1}'
    assert text[slice(*second.span)] == '[TOOL_CALLS]mul{"a": 2}'


def test_formats_restricts_recognised_syntax():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call> and {"name": "g", "arguments": {}}'
    assert [c.name for c in parse_text(text, formats={"bare_json"}).calls] == ["f", "g"]
    assert [c.name for c in parse_text(text, formats=["hermes"]).calls] == ["f"]
    assert parse_text(text, formats=()).calls == ()


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown call format.*hermez"):
        parse_text("x", formats={"hermez"})


def test_empty_and_non_string_input():
    assert parse_text("") == TextParse((), False, "")
    assert parse_text(None) == TextParse((), False, "")  # type: ignore[arg-type]


def test_a_family_skipped_for_lack_of_its_lead_characters_finds_nothing_there():
    """parse_text runs a family only where a first character of one of its start markers occurs
    (parse._LEADS): sound only if the finder, run anyway, finds nothing. Checked on every example
    with each such character taken out."""
    from toolproxy.calls import parse

    texts = [row[1].replace(ch, "") for row in ROWS for ch in sorted(parse._ANY_LEAD)]
    skipped = 0
    for text in texts:
        for finder, _ in parse.FINDERS:
            if not any(ch in text for ch in parse._LEADS[finder]):
                skipped += 1
                found = finder(text, None, lambda i: None) if finder is parse.find_bare else finder(text, None)
                assert found == [], (finder.__name__, text)
    assert skipped >= len(texts)  # every text lacks one character, so some family was skipped
