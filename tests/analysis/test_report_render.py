"""Every renderer over the same real DuckDB store: numbers agree, "rej" shows, html stays offline."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from analysis.report import FORMATS, render
from analysis.report.cells import OUTCOME_LABELS
from analysis.report.htmlpage import COLOURS
from storebuilder import Episode, Run, T, build_store, load_report


@pytest.fixture
def report(mixed_store):
    return load_report(mixed_store)


def test_terminal_table_fits_100_columns_and_shows_rej(report):
    text = render(report, "table")
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines[: 2 + len(report.runs)]), "table rows wider than 100 columns"
    header = lines[0].split()
    assert header[:4] == ["run", "stack", "model", "cond"]
    rows = {line.split()[0]: line for line in lines[2: 2 + len(report.runs)]}
    assert set(rows) == {"gemma-vllm", "qwen-native", "qwen-sglang", "qwen-text"}
    gemma = rows["gemma-vllm"].split()
    assert gemma.count("rej") == 2 and "100%" in gemma and "0%" not in gemma
    assert re.search(r"52% \[\d+-\d+\]\s+71%\s+15%\s+0%\s+1$", rows["qwen-native"])
    prose = " ".join(text.split())  # notes are wrapped to the width
    assert "qwen-sglang: 2 turns the harness saw as prose held a valid call" in prose
    assert "gemma-vllm: every turn was a non-response (refused 6)" in prose
    assert all(len(line) <= 100 for line in lines), "notes or legend wider than 100 columns"


def test_terminal_table_clips_names_not_numbers():
    from analysis.report.terminal import aligned

    rows = [["a-very-long-run-name-indeed", "some/extremely-long-model-name-from-a-hub", "123456789"]]
    lines = aligned(["run", "model", "turns"], rows, first_numeric=2, width=40)
    assert all(len(line) <= 40 for line in lines)
    assert lines[2].endswith("123456789")
    assert "…" in lines[2]


def test_markdown_has_both_tables_and_notes(report):
    text = render(report, "markdown")
    assert text.startswith("# toolproxy report")
    assert "| gemma-vllm | vllm 0.11.0 | google/gemma-3-4b-it | native | 6 | 3 | rej | rej | 100.0% | - | 0 |" in text
    assert "| qwen-native | 60.0% (12) | 10.0% (2) | 5.0% (1) | 5.0% (1) | 5.0% (1) | 15.0% (3) |" in text
    assert "## Notes" in text


def test_json_keeps_raw_numbers_and_nulls(report):
    doc = json.loads(render(report, "json"))
    assert doc["bootstrap"] == {"resamples": 10_000, "seed": 0, "confidence": 0.95, "unit": "episode"}
    runs = {r["run"]: r for r in doc["runs"]}
    gemma = runs["gemma-vllm"]
    assert gemma["rejected"] is True
    assert gemma["fidelity"]["pooled"] is None and gemma["fidelity"]["episode_mean"] is None
    assert gemma["surfaced_as_text"] is None
    native = runs["qwen-native"]
    f = native["fidelity"]
    assert f["ci_low"] <= f["episode_mean"] <= f["ci_high"]
    assert f["pooled"] == pytest.approx(12 / 17)
    assert sum(native["outcome_shares"].values()) == pytest.approx(1.0)
    assert native["non_response_kinds"] == {"http_5xx": 1, "timeout": 1, "retry_exhausted": 1}


def test_csv_is_one_flat_row_per_run(report):
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(render(report, "csv")))}
    assert len(rows) == 4
    assert rows["gemma-vllm"]["rejected"] == "True"
    assert rows["gemma-vllm"]["fidelity_pooled"] == ""
    assert rows["gemma-vllm"]["non_response_refused"] == "6"
    assert float(rows["qwen-native"]["fidelity_pooled"]) == pytest.approx(12 / 17)
    assert rows["qwen-native"]["outcome_hallucinated_call"] == "1"
    assert rows["qwen-sglang"]["harness_saw_prose"] == "2"
    low, mean, high = (float(rows["qwen-text"][k]) for k in ("ci_low", "fidelity_episode_mean", "ci_high"))
    assert low <= mean <= high


def test_html_is_one_offline_file_with_both_charts(report):
    page = render(report, "html")
    assert not re.search(r"https?:", page), "the page references the network"
    assert not re.search(r"<script|<link|<img|<iframe|@import|src=", page, re.I)
    hatches = {f"#hatch-{k}" for k in ("refused", "http_5xx", "timeout", "retry_exhausted")}
    assert set(re.findall(r"url\(([^)]*)\)", page)) == hatches | {"#seen-prose"}
    assert {f"#{i}" for i in re.findall(r'<pattern id="([^"]+)"', page)} >= hatches | {"#seen-prose"}
    assert page.count("<svg") == 2
    assert "Outcome composition" in page and "Protocol fidelity per run" in page
    for label in OUTCOME_LABELS.values():
        assert label in page
    # every non-zero outcome of every run is a bar segment, non-responses included
    segments = re.findall(r'<rect [^>]*fill="([^"]+)" class="segment"><title>([^:]+):', page)
    assert ("url(#hatch-refused)", "gemma-vllm") in segments
    # five model outcomes, then one non-response segment per cause (http_5xx, timeout, retry_exhausted)
    assert sum(1 for _, run in segments if run == "qwen-native") == 8
    assert sum(1 for _, run in segments if run == "gemma-vllm") == 1
    assert {fill for fill, _ in segments} == ({COLOURS[k] for k in COLOURS if k != "non_response"}
                                              | {f"url({h})" for h in hatches} | {"url(#seen-prose)"})
    assert "qwen-native: non-response (timeout), 1 of 20 turns (5.0%)" in page
    assert "gemma-vllm: non-response (refused), 6 of 6 turns (100.0%)" in page
    assert ">refused 100.0%</text>" in page and "non-response: retry_exhausted</li>" in page
    assert "rej: every turn was a non-response" in page
    # qwen-sglang's two valid calls left in the text are striped over its valid-call segment
    assert re.findall(r'fill="url\(#seen-prose\)" class="segment"><title>([^:]+): (\d+) valid calls', page) == [("qwen-sglang", "2")]
    assert "valid call the harness saw as prose" in page
    assert page.count('class="whisker"') == 3 * 3  # three runs with a CI: a line and two caps each
    assert report.source in page and f"toolproxy {report.toolproxy_version}" in page and report.generated_at in page


def test_html_escapes_names(tmp_path):
    path = build_store(tmp_path / "x.duckdb", [
        Run("<script>alert(1)</script>", "ollama", "0.12.6", 'm"odel', "native", [Episode("0", [T("valid_call")])]),
    ])
    page = render(load_report(path), "html")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'm"odel' not in page


def test_every_format_renders(report):
    for fmt in FORMATS:
        assert "qwen-native" in render(report, fmt)
