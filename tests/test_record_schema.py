"""The one verdict on a record line that every reader of segments uses (toolproxy.record.schema):
a table of records, and lines written to a real segment read back through read_checked."""

from __future__ import annotations

import orjson
import pytest

from toolproxy.record.model import Record, new_id
from toolproxy.record.schema import BAD_TYPE, CORRUPT, FIELDS, UNKNOWN_KIND, first_misfit, read_checked, verdict
from toolproxy.record.segments import SEGMENT_DIR


def good(**changes) -> dict:
    rec = orjson.loads(
        orjson.dumps(
            Record(
                id="r1",
                started_at=1.7e9,
                run="a",
                method="POST",
                path="/v1/chat/completions",
                status=200,
                request_body="{}",
                request_body_encoding="utf8",
            )
        )
    )
    rec.update(changes)
    return rec


CASES = [
    # (record, (issue kind, words in its message) or None: it is read)
    (good(), None),
    (good(kind="sampled_out"), None),
    (good(kind="fingerprint", extra={"stack": 5}), None),  # extra is kept as it is, whatever its shape
    (good(request_headers="x", response_headers={"a": "b"}, tags=[1], extra=[1, 2], upstream_request=3), None),
    (good(status=None, ttfb_ms=None, run=None), None),
    (good(status=2**31 - 1, started_at=-1.0, duration_ms=3), None),
    (good(id=""), (CORRUPT, "record has no id")),
    (good(id=5), (CORRUPT, "record has no id")),
    ({"started_at": 1.0}, (CORRUPT, "record has no id")),
    (good(kind="issue"), (UNKNOWN_KIND, "record kind 'issue' is not known")),
    (good(kind=None), (UNKNOWN_KIND, "record kind None is not known")),
    (good(kind=3), (BAD_TYPE, '"kind" is 3 (a number), which does not fit a string')),
    (good(request_body=12345), (BAD_TYPE, '"request_body" is 12345 (a number), which does not fit a string')),
    (good(status=True), (BAD_TYPE, '"status" is true (a boolean), which does not fit a 32-bit integer')),
    (good(status=2**31), (BAD_TYPE, '"status" is 2147483648 (a number)')),
    (good(status="200"), (BAD_TYPE, '"status" is "200" (a string)')),
    (good(started_at=1e13), (BAD_TYPE, "which does not fit a time in seconds since 1970")),
    (good(ttfb_ms="fast"), (BAD_TYPE, '"ttfb_ms" is "fast" (a string), which does not fit a number')),
    (good(run={"a": 1}), (BAD_TYPE, '"run" is {"a":1} (an object)')),
    (good(client_body_encoding=["base64"]), (BAD_TYPE, '"client_body_encoding" is ["base64"] (an array)')),
    # the bodies are named first, as analyze names them
    (good(status="x", response_body=5), (BAD_TYPE, '"response_body" is 5')),
    # an unknown kind is only that: its fields are not this toolproxy's to judge
    (good(kind="future", status="x"), (UNKNOWN_KIND, "record kind 'future' is not known")),
]


@pytest.mark.parametrize("rec,expected", CASES)
def test_verdict(rec, expected):
    got = verdict(rec)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got[0] == expected[0] and expected[1] in got[1], got


def test_every_field_of_the_record_that_has_a_type_here_is_one_the_proxy_writes():
    written = set(Record.__dataclass_fields__)
    assert set(FIELDS) <= written
    assert first_misfit(orjson.loads(orjson.dumps(Record(id=new_id(), started_at=1.0)))) is None


def test_read_checked_gives_each_line_or_why_it_was_set_aside(tmp_path):
    seg = tmp_path / SEGMENT_DIR
    seg.mkdir()
    lines = [
        orjson.dumps(good(id="a")),
        b"{not json",
        orjson.dumps(good(id="b", status=True)),
        b"[1]",
        orjson.dumps(good(id="c", kind="weird")),
        b"",
        orjson.dumps(good(id="d")),
    ]
    (seg / "20260101T000000-1-0001-x.jsonl").write_bytes(b"\n".join(lines) + b"\n" + b'{"id": "torn"')
    got = list(read_checked(tmp_path))
    assert [c.record["id"] if c.record else None for c in got] == ["a", None, None, None, None, "d"]
    issues = [c.issue for c in got if c.issue is not None]
    assert [(i.kind, i.record_id) for i in issues] == [
        (CORRUPT, None),
        (BAD_TYPE, "b"),
        (CORRUPT, None),
        (UNKNOWN_KIND, "c"),
    ]
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    assert [c.offset for c in got] == [offsets[i] for i in (0, 1, 2, 3, 4, 6)]
    assert issues[1].line().startswith(f'20260101T000000-1-0001-x.jsonl @{offsets[2]}: record b: "status" is true')
