"""Every renderer over the same real DuckDB store: numbers agree, "rej" shows, html stays offline."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from storebuilder import Episode, Run, T, build_store, load_report

from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.analysis.measure.metrics import METRICS
from toolproxy.analysis.report import OUTPUT_FORMATS, render
from toolproxy.analysis.report.cells import OUTCOME_LABELS
from toolproxy.analysis.report.htmlpage import COLOURS


@pytest.fixture
def report(mixed_store):
    return load_report(mixed_store)


def test_terminal_table_fits_100_columns_and_shows_rej(report):
    text = render(report, "table")
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines[: 2 + len(report.runs)]), "table rows wider than 100 columns"
    header = lines[0].split()
    # the headline: call and delivered fidelity side by side, then what the serving layer lost
    assert header[:8] == ["run", "cond", "turns", "eps", "call", "[95%", "CI]", "dlv"]
    rows = {line.split()[0]: line for line in lines[2 : 2 + len(report.runs)]}
    assert set(rows) == {"gemma-vllm", "qwen-native", "qwen-sglang", "qwen-text"}
    gemma = rows["gemma-vllm"].split()
    assert gemma.count("rej") == 6 and "100%" in gemma and "0%" not in gemma
    # 12 of 16 call turns valid: Wilson 95% [50.5, 89.8]; 1 of 4 episodes answered; 3 of 20 turns non-responses
    assert re.search(r"75% \[51-90\]\s+75% \[51-90\]\s+0%\s+-\s+-\s+25%\s+15%$", rows["qwen-native"])
    assert re.search(r"100% \[44-100\]\s+33% \[6-79\]\s+67%", rows["qwen-sglang"])
    details = {line.split()[0]: line for line in lines[3 + len(report.runs) : 5 + 2 * len(report.runs)]}
    # the per-episode mean says the episodes it is over: 4 of the run's 5 had a call due
    assert re.search(r"16 call, 1 answer\s+60% \(4/5 eps\)\s+71%\s+0%\s+1$", details["qwen-native"])
    prose = " ".join(text.split())  # notes are wrapped to the width
    assert (
        "qwen-sglang: lost in the serving layer: calls left in text: 2 of 3 turns due a call held a valid call "
        "the harness never got as a call"
    ) in prose
    assert (
        "gemma-vllm: every turn was a non-response (serving layer: refused 6 (the stack refused the request before "
        "the model ran)): no metric is defined (rej), the model's output never reached the harness"
    ) in prose
    assert f"analyzer v{ANALYZER_VERSION}" in prose
    assert all(len(line) <= 100 for line in lines), "notes or legend wider than 100 columns"


def test_terminal_table_clips_names_not_numbers():
    from toolproxy.analysis.report.terminal import aligned

    rows = [["a-very-long-run-name-indeed", "some/extremely-long-model-name-from-a-hub", "123456789"]]
    lines = aligned(["run", "model", "turns"], rows, first_numeric=2, width=40)
    # The model gives up width; the run name never does (a reader types it back), nor the number.
    assert lines[2].startswith("a-very-long-run-name-indeed ") and lines[2].endswith("123456789")
    assert "…" in lines[2] and "some/extremely-long-model-name-from-a-hub" not in lines[2]


def test_markdown_has_both_tables_and_notes(report):
    text = render(report, "markdown")
    assert text.startswith("# toolproxy report")
    assert (
        "| gemma-vllm | vllm 0.11.0 | google/gemma-3-4b-it | native | 6 | 3 | rej | rej | rej | rej | rej | rej | rej "
        "| 100.0% | - | 0 |"
    ) in text
    assert (
        "| qwen-sglang | sglang 0.5.3 | Qwen/Qwen3-8B | native | 4 | 2 | 100.0% [43.9-100.0] | 33.3% [6.1-79.2] "
        "| 66.7% | - | - | 50.0% [9.5-90.5] | 75.0% | 0.0% | 66.7% | 0 |"
    ) in text
    assert (
        "| qwen-native | 60.0% over 4 of 5 episodes (too few for an interval: it takes 5) | 60.0% over 4 of 5 "
        "episodes (too few for an interval: it takes 5) | 16 call, 1 answer | refused 1, http_5xx 1, timeout 1 |"
        in text
    )
    assert "| qwen-native | 60.0% (12) | 10.0% (2) | 5.0% (1) | 5.0% (1) | 5.0% (1) | 15.0% (3) |" in text
    assert "## Notes" in text


def test_json_keeps_raw_numbers_and_nulls(report):
    doc = json.loads(render(report, "json"))
    assert doc["bootstrap"] == {
        "resamples": 10_000,
        "seed": 0,
        "confidence": 0.95,
        "unit": "episode",
        "min_episodes": 5,
    }
    assert doc["analyzer_version"] == doc["analyzer_version_current"] == ANALYZER_VERSION
    runs = {r["run"]: r for r in doc["runs"]}
    gemma = runs["gemma-vllm"]
    assert gemma["rejected"] is True
    for metric in METRICS:
        assert gemma[metric]["pooled"] is None and gemma[metric]["episode_mean"] is None
    assert gemma["surfaced_as_text"] is None
    native = runs["qwen-native"]
    c = native["call_fidelity"]
    assert (c["numerator"], c["denominator"], c["pooled"]) == (12, 16, 0.75)
    assert c["ci_low"] is None and c["interval_note"] == "too few episodes"
    assert native["paper_fidelity"]["pooled"] == pytest.approx(12 / 17)
    assert native["roles"] == {"call": 16, "answer": 1, "abstain": 0, "open": 0, "no_tools": 0}
    assert sum(native["outcome_shares"].values()) == pytest.approx(1.0)
    assert native["non_response_kinds"] == {"http_5xx": 1, "timeout": 1, "refused": 1}
    assert runs["qwen-sglang"]["lost_in_serving"] == pytest.approx(2 / 3)


def test_csv_is_one_flat_row_per_run(report):
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(render(report, "csv")))}
    assert len(rows) == 4
    assert rows["gemma-vllm"]["rejected"] == "True"
    assert rows["gemma-vllm"]["call_fidelity_pooled"] == ""
    assert rows["gemma-vllm"]["non_response_refused"] == "6"
    assert float(rows["qwen-native"]["paper_fidelity_pooled"]) == pytest.approx(12 / 17)
    assert float(rows["qwen-native"]["call_fidelity_pooled"]) == 0.75
    assert rows["qwen-native"]["role_answer"] == "1"
    assert rows["qwen-native"]["outcome_hallucinated_call"] == "1"
    assert rows["qwen-sglang"]["harness_saw_prose"] == "2"
    assert float(rows["qwen-sglang"]["delivered_fidelity_pooled"]) == pytest.approx(1 / 3)
    low, rate, high = (
        float(rows["qwen-text"][k])
        for k in ("call_fidelity_wilson_low", "call_fidelity_pooled", "call_fidelity_wilson_high")
    )
    assert low < rate < high


def test_html_is_one_offline_file_with_both_charts(report):
    page = render(report, "html")
    assert not re.search(r"https?:", page), "the page references the network"
    assert not re.search(r"<script|<link|<img|<iframe|@import|src=", page, re.I)
    hatches = {f"#hatch-{k}" for k in ("refused", "http_5xx", "timeout")}
    assert set(re.findall(r"url\(([^)]*)\)", page)) == hatches | {"#seen-prose"}
    assert {f"#{i}" for i in re.findall(r'<pattern id="([^"]+)"', page)} >= hatches | {"#seen-prose"}
    assert page.count("<svg") == 4  # the headline, composition, call and delivered charts
    assert "Outcome composition" in page and "Call fidelity per run" in page and "Delivered fidelity per run" in page
    for label in OUTCOME_LABELS.values():
        assert label in page
    # every non-zero outcome of every run is a bar segment, non-responses included
    segments = re.findall(r'<rect [^>]*fill="([^"]+)" class="segment"><title>([^:]+):', page)
    assert ("url(#hatch-refused)", "gemma-vllm") in segments
    # five model outcomes, then one non-response segment per cause (http_5xx, timeout, refused)
    assert sum(1 for _, run in segments if run == "qwen-native") == 8
    assert sum(1 for _, run in segments if run == "gemma-vllm") == 1
    assert {fill for fill, _ in segments} == (
        {COLOURS[k] for k in COLOURS if k != "non_response"} | {f"url({h})" for h in hatches} | {"url(#seen-prose)"}
    )
    assert "qwen-native: non-response (timeout), 1 of 20 turns (5.0%)" in page
    assert "gemma-vllm: non-response (refused), 6 of 6 turns (100.0%)" in page
    assert (
        ">refused 100.0%</text>" in page
        and "non-response: http_5xx (the stack answered an HTTP 5xx error: a serving failure)</li>" in page
    )
    assert page.count("rej: every turn was a non-response") == 3  # gemma-vllm in the headline, call, delivered
    # qwen-sglang's two valid calls left in the text are striped over its valid-call segment
    assert re.findall(r'fill="url\(#seen-prose\)" class="segment"><title>([^:]+): (\d+) valid calls', page) == [
        ("qwen-sglang", "2")
    ]
    assert "valid call the harness saw as prose" in page
    assert page.count('class="whisker"') == 2 * 3 * 3  # two charts, three runs with a rate: a line and two caps each
    assert report.source in page and f"toolproxy {report.toolproxy_version}" in page and report.generated_at in page


def test_html_escapes_names(tmp_path):
    path = build_store(
        tmp_path / "x.duckdb",
        [
            Run("<script>alert(1)</script>", "ollama", "0.12.6", 'm"odel', "native", [Episode("0", [T("valid_call")])]),
        ],
    )
    page = render(load_report(path), "html")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'm"odel' not in page


def test_every_format_renders(report):
    for fmt in OUTPUT_FORMATS:
        assert "qwen-native" in render(report, fmt)
