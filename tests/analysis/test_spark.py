"""The Spark job against `toolproxy analyze` on the same recordings: identical turns, episodes,
runs, calls, classified exchanges and report.

The recordings mix a generated bulk (toolproxy.testing.corpus: several stacks, streams, retries after 500s,
timeouts, refusals, an untagged run that needs reconstruction) with traffic recorded by four real
proxies, one per condition, sharing one data directory in front of the emulated llama-server:
chat (streamed and not), Responses chained by `previous_response_id` (once across runs) and
Messages, each through the official SDK.

The parity test starts a JVM and Spark workers (a minute or more on a busy 2-core machine), so it
carries the `spark` marker and is deselected by default:

    pytest -m spark tests/analysis/test_spark.py                        # ~3,000 generated exchanges
    TOOLPROXY_SPARK_EXCHANGES=100000 pytest -m spark -s tests/analysis/test_spark.py

The byte-range splitting is pure and runs in the default suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import duckdb
import openai
import pytest
from proxyprocess import ProxyProcess

from toolproxy.analysis.export.spark import line_range, split_segments
from toolproxy.emulators import FakeStack, ModelRequest, error, text, text_call
from toolproxy.record.segments import read_lines
from toolproxy.testing.corpus import generate

EXCHANGES = int(os.environ.get("TOOLPROXY_SPARK_EXCHANGES", "3000"))
MODEL = "qwen2.5-coder-0.5b"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_TOOLS = [{"type": "function", "function": WEATHER}]
RESPONSES_TOOLS = [{"type": "function", **WEATHER}]
MESSAGES_TOOLS = [
    {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
]


def _spark_missing() -> str | None:
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (Debian: apt-get install openjdk-17-jre-headless)"
    return None


# ---------------------------------------------------------------- byte ranges (default suite)


def _segment(tmp_path: Path, lines: list[bytes], tail: bytes = b"") -> Path:
    seg = tmp_path / "segments" / "20261130T000000-1-0001.jsonl"
    seg.parent.mkdir(parents=True, exist_ok=True)
    seg.write_bytes(b"".join(line + b"\n" for line in lines) + tail)
    return seg


@pytest.mark.parametrize("range_bytes", [1, 7, 16, 33, 1000])
@pytest.mark.parametrize("tail", [b"", b'{"torn'])
def test_ranges_cover_every_complete_line_once(tmp_path, range_bytes, tail):
    lines = [b'{"id":"a"}', b"", b'{"id":"bb","x":"' + b"y" * 40 + b'"}', b'{"id":"c"}', b'{"id":"dddd"}']
    seg = _segment(tmp_path, lines, tail)
    starts, torn = [], []
    for path, start, end in split_segments(tmp_path, range_bytes):
        first, last, torn_here = line_range(path, start, end)
        starts += [offset for offset, _, line in read_lines(path) if line is not None and first <= offset < last]
        torn.append(torn_here)
        assert first <= last
    expected = [offset for offset, _, line in read_lines(seg) if line is not None]
    assert starts == expected  # each complete line in exactly one range, the torn tail in none
    assert len(expected) == 4
    assert torn == [False] * (len(torn) - 1) + [bool(tail)]  # the torn tail is named once, by the last range


def test_no_segments_is_a_clear_error(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "toolproxy.analysis.export.spark", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "no segments under" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- parity (pytest -m spark)


def _model(req: ModelRequest):
    """Qwen on llama.cpp as observed: the call as text; after a tool result, an answer."""
    if any(
        m.get("role") == "tool" or "<tool_result" in str(m.get("content"))
        for m in req.messages
        if m.get("role") != "system"
    ):
        return text("It is 18 C in Oslo.")
    return text_call("hermes", "get_weather", {"city": "Oslo"}, before="Let me check. ")


def _record(p: ProxyProcess, condition: str, fake: FakeStack) -> int:
    """One proxy's share of the mixed traffic; returns how many exchanges it recorded."""
    chat = openai.OpenAI(base_url=f"{p.url}/t/run=chat-{condition}/v1", api_key="sk-test", max_retries=0, timeout=30)
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    first = chat.chat.completions.create(model=MODEL, messages=ask, tools=CHAT_TOOLS)
    msg = first.choices[0].message
    follow = [*ask, msg.model_dump(exclude_none=True)]
    if msg.tool_calls:
        follow.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "18 C"})
    else:
        follow.append({"role": "user", "content": "Go on."})
    for _ in chat.chat.completions.create(model=MODEL, messages=follow, tools=CHAT_TOOLS, stream=True):
        pass
    fake.enqueue(error(500, "CUDA out of memory"))  # a retry: one turn, two attempts
    try:
        chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Rain?"}], tools=CHAT_TOOLS)
    except openai.InternalServerError:
        pass
    chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Rain?"}], tools=CHAT_TOOLS)

    resp = openai.OpenAI(base_url=f"{p.url}/t/run=resp-{condition}/v1", api_key="sk-test", max_retries=0, timeout=30)
    r1 = resp.responses.create(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS)
    r2 = resp.responses.create(model=MODEL, tools=RESPONSES_TOOLS, previous_response_id=r1.id, input="And Bergen?")
    # The same conversation continued under another run: its chain crosses runs.
    other = openai.OpenAI(base_url=f"{p.url}/t/run=resp-{condition}-b/v1", api_key="sk-test", max_retries=0, timeout=30)
    other.responses.create(model=MODEL, tools=RESPONSES_TOOLS, previous_response_id=r2.id, input="And Lima?")

    msgs = anthropic.Anthropic(
        base_url=f"{p.url}/t/run=msg-{condition}", api_key="sk-ant-test", max_retries=0, timeout=30
    )
    m = msgs.messages.create(model=MODEL, max_tokens=50, tools=MESSAGES_TOOLS, messages=ask)
    msgs.messages.create(
        model=MODEL,
        max_tokens=50,
        tools=MESSAGES_TOOLS,
        messages=[
            *ask,
            {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": "thanks"},
        ],
    )
    return 9


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> Path:
    why = _spark_missing()
    if why:
        pytest.skip(why)
    data = tmp_path_factory.mktemp("spark-data")
    fake = FakeStack("llamacpp", models={MODEL: ["completion", "tools"]}, responder=_model, cached_tokens=7)
    recorded = 0
    with fake.in_thread():
        for condition in ("native", "text", "hint", "constrained"):
            p = ProxyProcess(fake.url, data, ("--durability", "sync", "--condition", condition))
            try:
                recorded += _record(p, condition, fake)
                assert len(p.wait_records(recorded)) == recorded
            finally:
                p.stop()
    generate(data, EXCHANGES, seed=7, segment_records=max(1000, EXCHANGES // 8))
    return data


def _tool(*args: str, timeout: float = 3600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    return r, time.perf_counter() - t0


def _rows(con, query: str) -> list[tuple]:
    return sorted(con.execute(query).fetchall(), key=repr)


def _same(con, table: str, spark_dir: Path, columns: str = "*") -> int:
    duck = _rows(con, f"SELECT {columns} FROM {table}")
    spark = _rows(con, f"SELECT {columns} FROM read_parquet('{spark_dir / table}/*.parquet')")
    assert len(duck) == len(spark), f"{table}: {len(duck)} rows in DuckDB, {len(spark)} from Spark"
    diff = [(a, b) for a, b in zip(duck, spark) if a != b]
    assert not diff, f"{table}: first difference {diff[0]}"
    return len(duck)


@pytest.mark.spark
@pytest.mark.timeout(4 * 3600)
def test_spark_job_matches_duckdb_analyze(recordings, tmp_path):
    cli = ("-c", "from toolproxy.cli import main; main()")
    duck, duck_s = _tool(*cli, "analyze", "--data", str(recordings))
    assert duck.returncode == 0 and "issues: none" in duck.stdout, duck.stdout + duck.stderr
    report, _ = _tool(*cli, "report", "--data", str(recordings), "--format", "json")
    assert report.returncode == 0, report.stderr
    out = tmp_path / "spark-out"
    spark, spark_s = _tool(
        "-m",
        "toolproxy.analysis.export.spark",
        "--data",
        str(recordings),
        "--out",
        str(out),
        "--master",
        "local[2]",
        "--format",
        "json",
    )
    assert spark.returncode == 0, spark.stderr[-5000:]

    a, b = json.loads(report.stdout), json.loads(spark.stdout)
    for doc in (a, b):
        del doc["generated_at"], doc["source"]
    assert [r["run"] for r in a["runs"]] == [r["run"] for r in b["runs"]]
    assert len(a["runs"]) >= 8 + 4 * 4
    assert a == b  # every outcome count, metric, interval and role, run by run

    con = duckdb.connect(str(recordings / "toolproxy.duckdb"), read_only=True)
    counts = {t: _same(con, t, out) for t in ("turns", "episodes", "runs", "calls")}
    spark_cols = [
        r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{out}/exchanges/*.parquet')").fetchall()
    ]
    counts["exchanges"] = _same(con, "exchanges", out, ", ".join(f'"{c}"::VARCHAR' for c in spark_cols))
    # the continuation recorded under another run is chained to its stored response, in both engines
    crossed = con.execute(
        "SELECT count(*) FROM exchanges WHERE run LIKE 'resp-%-b' AND len(parent_hashes) > 0"
    ).fetchall()[0][0]
    assert counts["exchanges"] >= EXCHANGES and crossed == 4
    outcomes = dict(con.execute("SELECT outcome, count(*) FROM turns GROUP BY 1").fetchall())
    conditions = {r[0] for r in con.execute("SELECT DISTINCT condition FROM turns").fetchall()}
    assert conditions == {"native", "text", "hint", "constrained"} and len(outcomes) >= 5, (conditions, outcomes)
    print(
        f"\nparity: {counts} rows identical; outcomes {outcomes}; "
        f"DuckDB analyze {duck_s:.1f}s, Spark local[2] {spark_s:.1f}s (both process start included)"
    )
