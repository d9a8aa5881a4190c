"""report, compare, show and export analyze first when the proxy recorded since the last analyze:
a real proxy records into a real data dir while the commands run as the user runs them."""

from __future__ import annotations

import json
import shutil
import urllib.request

from proxyprocess import toolproxy_cli

from toolproxy.analysis.load.staleness import unanalyzed_segments
from toolproxy.analysis.store.connection import default_db
from toolproxy.record.segments import list_segments


def _ask(proxy, fake, run: str) -> None:
    """The same item in every run, so any two runs pair."""
    body = json.dumps({"model": fake.model, "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = urllib.request.Request(
        f"{proxy.url}/t/run={run}/item=q1/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def _record(proxy, fake, run: str, total: int) -> dict:
    _ask(proxy, fake, run)
    return next(r for r in proxy.wait_records(total) if r["run"] == run)


def _analyzing_first(done, command: str, data) -> None:
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == (
        f"toolproxy {command}: 1 segment in {data} holds records not analyzed yet; "
        f"analyzing first (toolproxy analyze --data {data})"
    ), done.stderr


def test_each_reading_command_analyzes_what_was_recorded_since(fake_stack, proxy, tmp_path):
    fake = fake_stack("vllm", tool_parser="hermes")
    p = proxy(fake.url)
    data = p.data
    _record(p, fake, "first", 1)
    assert toolproxy_cli("analyze", "--data", str(data)).returncode == 0

    new = _record(p, fake, "second", 2)
    done = toolproxy_cli("show", new["id"], "--data", str(data))
    _analyzing_first(done, "show", data)
    assert new["id"] in done.stdout and "analyz" not in done.stdout  # stdout is the exchange alone

    _record(p, fake, "third", 3)
    done = toolproxy_cli("compare", "first", "third", "--data", str(data), "--format", "json")
    _analyzing_first(done, "compare", data)
    assert json.loads(done.stdout)["run_b"] == "third"

    _record(p, fake, "fourth", 4)
    done = toolproxy_cli(
        "export", "--data", str(data), "--out", str(tmp_path / "parquet"), "--run", "fourth", "--quiet"
    )
    _analyzing_first(done, "export", data)
    assert list((tmp_path / "parquet").rglob("run=fourth"))

    _record(p, fake, "fifth", 5)
    done = toolproxy_cli("report", "--data", str(data), "--format", "json")
    _analyzing_first(done, "report", data)
    assert [r["run"] for r in json.loads(done.stdout)["runs"]] == ["fifth", "first", "fourth", "second", "third"]

    again = toolproxy_cli("report", "--data", str(data), "--format", "json")  # the proxy still records into it
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert json.loads(again.stdout)["runs"] == json.loads(done.stdout)["runs"]


def test_a_database_given_with_db_is_read_as_it_is(fake_stack, proxy, tmp_path):
    fake = fake_stack("vllm", tool_parser="hermes")
    p = proxy(fake.url)
    _record(p, fake, "first", 1)
    copy = tmp_path / "copy.duckdb"
    assert toolproxy_cli("analyze", "--data", str(p.data), "--db", str(copy)).returncode == 0
    _record(p, fake, "second", 2)
    done = toolproxy_cli("report", "--data", str(p.data), "--db", str(copy), "--format", "json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert [r["run"] for r in json.loads(done.stdout)["runs"]] == ["first"]


def test_a_torn_last_line_is_not_news_and_a_finished_one_is(fake_stack, proxy, tmp_path):
    """The proxy writes a line at a time: bytes after the last newline are a line being written."""
    fake = fake_stack("vllm", tool_parser="hermes")
    p = proxy(fake.url)
    _record(p, fake, "first", 1)
    data = tmp_path / "copy"
    shutil.copytree(p.data / "segments", data / "segments")
    assert unanalyzed_segments(data, default_db(data)) == [s.name for s in list_segments(data)]  # no database yet
    assert toolproxy_cli("analyze", "--data", str(data)).returncode == 0
    assert unanalyzed_segments(data, default_db(data)) == []
    (segment,) = list_segments(data)
    with open(segment, "ab") as f:
        f.write(b'{"kind": "exchange", "id": "torn')
    assert unanalyzed_segments(data, default_db(data)) == []
    with open(segment, "ab") as f:
        f.write(b'"}\n')
    assert unanalyzed_segments(data, default_db(data)) == [segment.name]
