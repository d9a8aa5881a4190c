"""`toolproxy analyze`, `sql`, `show` run as the user runs them: a subprocess, real files."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time

import orjson
import pytest
from proxyprocess import together

from toolproxy.analysis.store.connection import connect
from toolproxy.record.model import Record, encode_body, new_id

sys_path_cmd = [sys.executable, "-c", "from toolproxy.cli import main; main()"]


def tp(*args, cwd=None):
    return subprocess.run([*sys_path_cmd, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture
def data(tmp_path):
    seg = tmp_path / "data" / "segments"
    seg.mkdir(parents=True)
    rec = Record(
        id=new_id(),
        started_at=time.time(),
        run="sglang-text",
        episode="1",
        item="simple_3",
        method="POST",
        path="/v1/chat/completions",
        upstream="http://127.0.0.1:30000",
    )
    rec.request_body, rec.request_body_encoding = encode_body(
        orjson.dumps(
            {
                "model": "qwen",
                "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "parameters": {
                                "type": "object",
                                "properties": {"city": {"type": "string"}},
                                "required": ["city"],
                            },
                        },
                    }
                ],
            }
        )
    )
    rec.status = rec.client_status = 200
    rec.response_body, rec.response_body_encoding = encode_body(
        orjson.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "matched_stop": 1,
                        "message": {
                            "role": "assistant",
                            "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": '
                            '"Oslo"}}\n</tool_call>',
                        },
                        "finish_reason": "stop",
                    }
                ]
            }
        )
    )
    (seg / "20261129T120000-1-0001.jsonl").write_bytes(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
    return tmp_path / "data", rec.id


def test_analyze_then_sql_and_show(data):
    d, rid = data
    r = tp("analyze", "--data", str(d))
    assert r.returncode == 0, r.stderr
    assert "new exchanges: 1" in r.stdout and "turns: 1" in r.stdout and "issues: none" in r.stdout
    assert (d / "toolproxy.duckdb").exists()
    r = tp("analyze", "--data", str(d))
    assert r.returncode == 0 and "new exchanges: 0" in r.stdout

    as_json, as_csv, by_db, shown = together(  # read-only: side by side
        lambda: tp(
            "sql", "--data", str(d), "--format", "json", "select outcome, surface, harness_saw_prose from turns"
        ),
        lambda: tp("sql", "--data", str(d), "--format", "csv", "select run, stack from runs"),
        lambda: tp("sql", "--db", str(d / "toolproxy.duckdb"), "select category, item_key from episodes"),
        lambda: tp("show", "--data", str(d), rid[:12].lower()),
    )
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == [{"outcome": "valid_call", "surface": "text", "harness_saw_prose": True}]
    assert as_csv.stdout == "run,stack\nsglang-text,sglang\n"
    assert (
        by_db.returncode == 0 and "simple" in by_db.stdout and "simple_3" in by_db.stdout and "(1 row)" in by_db.stdout
    )

    assert shown.returncode == 0, shown.stderr
    assert "outcome: valid_call  surface: text" in shown.stdout
    assert "HARNESS SAW PROSE" in shown.stdout and "get_weather" in shown.stdout and "Weather in Oslo?" in shown.stdout


def test_bodies_are_read_from_the_segments_and_a_missing_one_is_a_clear_error(data):
    d, rid = data
    assert tp("analyze", "--data", str(d)).returncode == 0
    query = (
        "select bodies(segment, segment_offset).request_body as req, "
        "bodies(segment, segment_offset).response_body_encoding as enc from exchanges"
    )
    r = tp("sql", "--data", str(d), "--format", "json", query)
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    assert row["enc"] == "utf8" and json.loads(row["req"])["messages"][0]["content"] == "Weather in Oslo?"
    # the segment goes away behind the database's back (not through prune, which drops its rows)
    seg = d / "segments" / "20261129T120000-1-0001.jsonl"
    seg.rename(seg.with_suffix(".moved"))
    r = tp("sql", "--data", str(d), query)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"segment {seg.name} is not in {d / 'segments'}" in r.stderr
    r = tp("show", "--data", str(d), "--raw", rid)
    assert r.returncode == 0, r.stderr
    assert "bodies not readable" in r.stdout and "outcome: valid_call" in r.stdout
    r = tp("analyze", "--data", str(d), "--reclassify")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"cannot reclassify exchange {rid}" in r.stderr and "give the --data that holds them" in r.stderr
    # nothing was half rebuilt: with the segment back, everything reads as before
    seg.with_suffix(".moved").rename(seg)
    r = tp("analyze", "--data", str(d), "--reclassify")
    assert r.returncode == 0 and "1 exchanges reclassified" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["analyze", "--data", "/nonexistent/dir"], "does not exist"),
        (["sql", "--data", "/nonexistent/dir", "select 1"], "no data directory at /nonexistent/dir"),
        (["show", "--data", "/nonexistent/dir", "01ABC"], "no data directory at /nonexistent/dir"),
    ],
)
def test_user_mistakes_exit_2_without_traceback(args, message):
    r = tp(*args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_bad_sql_unknown_id_and_not_a_data_dir(data, tmp_path):
    d, _ = data
    assert tp("analyze", "--data", str(d)).returncode == 0
    r, shown = together(
        lambda: tp("sql", "--data", str(d), "select nope from turns"), lambda: tp("show", "--data", str(d), "ZZZZ")
    )
    assert r.returncode == 2 and "query failed" in r.stderr and "Traceback" not in r.stderr
    assert shown.returncode == 2 and "no exchange with id" in shown.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = tp("analyze", "--data", str(empty))
    assert r.returncode == 2 and "holds no recordings" in r.stderr


def test_locked_database_is_a_clear_error(data):
    d, _ = data
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb,sys,time; c=duckdb.connect(sys.argv[1]); print('locked', flush=True); time.sleep(60)",
            str(d / "toolproxy.duckdb"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = tp("analyze", "--data", str(d))
        assert r.returncode == 2 and "in use by another process" in r.stderr and "Traceback" not in r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert tp("analyze", "--data", str(d)).returncode == 0
    connect(d / "toolproxy.duckdb").close()


HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202eevil\r<script>alert(1)</script>|cell\nbreak"
BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def inert(text: str) -> bool:
    """Nothing a terminal would act on: no C0 control but newline and tab, no DEL or C1, no bidi control."""
    return not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F or c in BIDI for c in text)


@pytest.fixture
def hostile(tmp_path):
    """A recording where the model, the run name and a corrupt record all carry terminal controls."""
    seg = tmp_path / "data" / "segments"
    seg.mkdir(parents=True)
    rec = Record(
        id=new_id(),
        started_at=time.time(),
        run="run" + HOSTILE,
        episode="1",
        method="POST",
        path="/v1/chat/completions",
        upstream="http://127.0.0.1:9",
    )
    rec.request_body, rec.request_body_encoding = encode_body(
        orjson.dumps({"model": "m" + HOSTILE, "messages": [{"role": "user", "content": "say " + HOSTILE}]})
    )
    rec.status = rec.client_status = 200
    rec.response_body, rec.response_body_encoding = encode_body(
        orjson.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "reply " + HOSTILE},
                        "finish_reason": "stop",
                    }
                ]
            }
        )
    )
    bad = orjson.loads(orjson.dumps(rec))
    bad.update(id=new_id(), status="\u202e\x9b" + HOSTILE)
    (seg / "20261129T120000-1-0001.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (rec, bad)))
    return tmp_path / "data", rec.id, bad["id"]


def test_analyze_sets_aside_a_bad_record_and_says_how_to_see_it(hostile):
    d, rid, bad_id = hostile
    r = tp("analyze", "--data", str(d))
    assert r.returncode == 0, r.stderr
    assert "new exchanges: 1" in r.stdout and inert(r.stdout)
    assert "set aside: 1 line that could not be stored (bad_type 1); every other line was ingested" in r.stdout
    query = r.stdout.split("toolproxy sql --data ")[1].splitlines()[0].split(" ", 1)[1].strip('"')
    r = tp("sql", "--data", str(d), "--format", "json", query)
    assert r.returncode == 0, r.stderr
    (issue,) = json.loads(r.stdout)
    assert issue["record_id"] == bad_id and issue["kind"] == "bad_type" and issue["message"].startswith("record ")
    assert "does not fit a 32-bit integer" in issue["message"]
    r = tp("analyze", "--data", str(d))
    assert r.returncode == 0 and "new exchanges: 0" in r.stdout and "set aside" not in r.stdout


def test_model_text_is_inert_on_the_terminal_and_lossless_in_data(hostile):
    d, rid, _ = hostile
    assert tp("analyze", "--data", str(d)).returncode == 0
    query = "select run, content from exchanges"
    fmts = ("table", "json", "markdown")
    shown, table, tail, as_json, csv, *reports = together(  # read-only: side by side
        lambda: tp("show", "--data", str(d), "--raw", rid),
        lambda: tp("sql", "--data", str(d), query),
        lambda: tp("sql", "--data", str(d), "select right(content, 12) as tail from exchanges"),
        lambda: tp("sql", "--data", str(d), "--format", "json", query),
        # CSV into a pipe or file is data: byte-exact
        lambda: subprocess.run(
            [*sys_path_cmd, "sql", "--data", str(d), "--format", "csv", "select content from exchanges"],
            capture_output=True,
            timeout=120,
        ),
        *[lambda fmt=fmt: tp("report", "--data", str(d), "--format", fmt) for fmt in fmts],
    )
    r = shown
    assert r.returncode == 0 and inert(r.stdout), r.stdout
    assert "reply \\x1b[2J\\x1b]0;owned\\x07\\u009b31m\\u202eevil\\r<script>" in r.stdout
    assert table.returncode == 0 and inert(table.stdout) and "| reply \\x1b[2J\\x1b]0;owned" in table.stdout
    assert "|cell\\nbreak" in tail.stdout
    assert inert(as_json.stdout) and json.loads(as_json.stdout) == [
        {"run": "run" + HOSTILE, "content": "reply " + HOSTILE}
    ]
    assert csv.stdout.decode() == 'content\n"reply ' + HOSTILE + '"\n'
    for fmt, r in zip(fmts, reports):
        assert r.returncode == 0 and inert(r.stdout), (fmt, r.stdout)
    assert json.loads(reports[1].stdout)["runs"][0]["run"] == "run" + HOSTILE


def test_markdown_report_escapes_html_and_table_breakers(hostile):
    d, _, _ = hostile
    assert tp("analyze", "--data", str(d)).returncode == 0
    md = tp("report", "--data", str(d), "--format", "markdown").stdout
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;\\|cell<br>break" in md
    tables = [
        list(rows)
        for is_table, rows in itertools.groupby(md.splitlines(), lambda line: line.startswith("|"))
        if is_table
    ]
    assert len(tables) >= 2
    for rows in tables:  # header, rule, the one run: every row has as many cells as the header
        assert len(rows) == 3 and len({len(re.findall(r"(?<!\\)\|", row)) for row in rows}) == 1, rows
