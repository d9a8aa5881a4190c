"""The HTML report's own sections over a real recording: the proxy in front of a fake stack,
`toolproxy analyze`, then `toolproxy report --format html` as a user runs them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import openai
import pytest
from storebuilder import Episode, Run, T, build_store, load_report

from toolproxy.analysis.measure.summary import select_runs, summarize
from toolproxy.analysis.report.details import NONE, TURN_COLUMNS, Count, page_details
from toolproxy.analysis.report.htmlpage import render
from toolproxy.analysis.store.connection import connect
from toolproxy.emulators import call, text

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
ITEMS = ["simple_1", "simple_2", "multiple_1", "multiple_2"]
CACHED = 16


def tp(*args):
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def episode(fake, url, run, item, replies):
    """One agent episode: call, tool result, and so on until the model answers in prose."""
    fake.enqueue(*replies)
    c = openai.OpenAI(base_url=f"{url}/t/run={run}/episode={item}/item={item}/v1", api_key="sk-test", max_retries=0)
    messages = [{"role": "user", "content": f"Weather for {item}?"}]
    for _ in replies:
        msg = c.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
        if not msg.tool_calls:
            return
        messages.append(msg.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": tc.id, "content": "5C"} for tc in msg.tool_calls]


@pytest.fixture
def recorded(fake_stack, proxy, tmp_path):
    """Run A: call then answer. Run B: call, a call missing its argument, then answer."""
    data = tmp_path / "data"
    fake = fake_stack("openai", cached_tokens=CACHED)
    p = proxy(fake.url, "--durability", "sync", data=data)
    for item in ITEMS:
        episode(fake, p.url, "A", item, [call("get_weather", {"city": "Oslo"}), text("5C in Oslo.")])
        episode(
            fake,
            p.url,
            "B",
            item,
            [call("get_weather", {"city": "Oslo"}), call("get_weather", {}), text("5C in Oslo.")],
        )
    records = p.wait_records(20)
    p.stop()
    r = tp("analyze", "--data", str(data))
    assert r.returncode == 0, r.stderr
    return data, [rec for rec in records if rec.get("kind", "exchange") == "exchange"]


def details_of(data):
    con = connect(data / "toolproxy.duckdb", read_only=True)
    try:
        report = summarize(con, select_runs(con, None, data), str(data))
        return report, page_details(con, report)
    finally:
        con.close()


def test_page_from_a_real_recording(recorded, tmp_path):
    """One recording (it takes seconds): the figures, then the page that shows them."""
    data, records = recorded
    _, d = details_of(data)
    # the prose after a tool result is an answer, not a missed call: only call turns are counted
    assert d.by_turn["A"] == [Count(4, 4, 4), *[NONE] * (TURN_COLUMNS - 1)]
    assert d.by_turn["B"] == [Count(4, 4, 4), Count(0, 0, 4), *[NONE] * (TURN_COLUMNS - 2)]
    assert d.categories == ["multiple", "simple"]
    assert d.by_category[("A", "simple")] == Count(2, 2, 2)
    assert d.by_category[("B", "multiple")] == Count(2, 2, 4)
    assert [(c.run_a, c.run_b, c.overall.paired) for c in d.comparisons] == [("A", "B", 4)]
    for run, turns in (("A", 8), ("B", 12)):
        recs = [r for r in records if r["run"] == run]
        usage = [json.loads(r["response_body"])["usage"] for r in recs]
        u = d.usage[run]
        assert u.answered == u.reported == turns
        assert u.prompt_tokens == sum(x["prompt_tokens"] for x in usage)
        assert u.completion_tokens == sum(x["completion_tokens"] for x in usage)
        assert u.cached_tokens == CACHED * turns
        ttfb = [r["ttfb_ms"] for r in recs]
        assert u.ttfb_p50_ms == pytest.approx(np.percentile(ttfb, 50))
        assert u.ttfb_p95_ms == pytest.approx(np.percentile(ttfb, 95))
        assert u.total_p95_ms == pytest.approx(np.percentile([r["duration_ms"] for r in recs], 95))

    # the page, as `toolproxy report --format html` writes it, and its paired row as `compare` says
    page_file = tmp_path / "page.html"
    r = tp("report", "--data", str(data), "--format", "html", "-o", str(page_file))
    assert r.returncode == 0, r.stderr
    page = page_file.read_text()
    assert not re.search(r"https?:", page) and not re.search(r"<script|<link|<img|<iframe|@import|src=", page, re.I)
    for heading in ("Fidelity by turn index", "By category", "Paired comparisons", "Latency and tokens"):
        assert f"<h2>{heading}</h2>" in page
    assert page.count("<svg") == 5  # headline, composition, call, delivered, turn index
    r = tp("compare", "A", "B", "--data", str(data), "--by", "category", "--format", "json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["overall"]
    expected = [str(c[k]) for k in ("paired", "both_pass", "a_only", "b_only", "both_fail")]
    row = re.search(r"<tr><td>A</td><td>B</td>(.*?)</tr>", page).group(1)
    assert re.findall(r"<td class=num>([^<]*)</td>", row)[:5] == expected
    assert "Each pair by category" in page
    # turn 2 of B: a cell with its counts; A's second turns were answers, not due a call
    assert (
        "B, turn 2: 0 of 4 turns due a call held a valid call (0.0%), 0 delivered it to the harness (0.0%)" in page
        and "A, turn 2: no turn due a call" in page
    )
    assert f"{CACHED * 8:,} (" in page


def test_calls_left_in_text_show_as_a_gap(mixed_store):
    report = load_report(mixed_store)
    con = connect(mixed_store, read_only=True)
    try:
        d = page_details(con, report)
        page = render(report, d)
    finally:
        con.close()
    # qwen-sglang: three valid calls due; two left in the text (not delivered), one in tool_calls
    assert d.by_turn["qwen-sglang"][0] == Count(2, 1, 2)
    assert "qwen-sglang, turn 1: 2 of 2 turns due a call held a valid call (100.0%), 1 delivered it" in page
    assert ">dlv 50% · n=2</text>" in page
    headline = page[page.index("<h2>Call and delivered fidelity</h2>") : page.index("<h2>Runs</h2>")]
    assert re.search(
        r"<title>qwen-sglang: call fidelity 100\.0% \[[\d.]+-100\.0\], delivered 33\.3% \[[\d.-]+\]; "
        r"66\.7% lost in the serving layer: calls left in text</title>",
        headline,
    )
    assert 'class="gap"' in headline and headline.count('class="gap"') == 1
    assert "rej: every turn was a non-response" in headline  # gemma-vllm


def test_hostile_names_stay_inert(tmp_path):
    evil = "<img src=x onerror=alert(1)>"
    path = build_store(
        tmp_path / "x.duckdb",
        [
            Run(evil, "ollama", "0.12.6", "m", "native", [Episode("0", [T("valid_call"), T("prose")], "i1", evil)]),
            Run("plain", "ollama", "0.12.6", "m", "text", [Episode("0", [T("valid_call@text")], "i1", evil)]),
        ],
    )
    con = connect(path, read_only=True)
    try:
        report = load_report(path)
        page = render(report, page_details(con, report))
    finally:
        con.close()
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "Paired comparisons" in page and "By category" in page
