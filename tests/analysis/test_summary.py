"""Per-run aggregates from a real DuckDB file with the analyzer's columns; numbers worked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from storebuilder import build_store, load_report

from toolproxy.analysis.measure.summary import OUTCOMES
from toolproxy.analysis.store.connection import StoreError


def _summaries(path: Path, runs=None, seed=0):
    report = load_report(path, runs, seed)
    return {s.run: s for s in report.runs}, report


def test_every_outcome_counted_and_metrics_worked_by_hand(mixed_store):
    runs, report = _summaries(mixed_store)
    assert list(runs) == ["gemma-vllm", "qwen-native", "qwen-sglang", "qwen-text"]
    s = runs["qwen-native"]
    assert (s.stack, s.stack_version, s.model, s.condition) == ("ollama", "0.12.6", "qwen3:8b", "native")
    assert (s.turns, s.episodes) == (20, 5)
    assert s.outcomes == {
        "valid_call": 12,
        "invalid_args": 2,
        "hallucinated_call": 1,
        "unparseable": 1,
        "prose": 1,
        "non_response": 3,
    }
    assert sum(s.outcome_shares.values()) == pytest.approx(1.0)
    assert s.non_response_kinds == {"http_5xx": 1, "timeout": 1, "refused": 1}
    # Episode 0 ends in prose after its calls' results: an answer, not a missed call.
    assert s.roles == {"call": 16, "answer": 1, "abstain": 0, "open": 0, "no_tools": 0}
    c = s.call_fidelity
    assert (c.numerator, c.denominator) == (12, 16) and c.pooled == pytest.approx(0.75)
    assert c.episode_mean == pytest.approx((1 + 0.5 + 0 + 0.9) / 4)
    assert (c.episodes_rated, c.episodes_unrated) == (4, 1)
    assert c.ci_low is None and c.interval_note == "too few episodes"
    assert c.wilson_low < 0.75 < c.wilson_high
    assert s.delivered_fidelity == c  # every call native: nothing lost in serving
    assert s.lost_in_serving == 0.0
    p = s.paper_fidelity  # the original study's definition counts the final answer as a miss
    assert (p.numerator, p.denominator) == (12, 17)
    assert p.episode_mean == pytest.approx((2 / 3 + 1 / 2 + 0 + 9 / 10) / 4)
    assert (s.answer_rate.numerator, s.answer_rate.denominator) == (1, 4)
    assert s.restraint.pooled is None
    assert s.non_response_rate.pooled == pytest.approx(3 / 20)
    assert (s.calls, s.text_calls, s.surfaced_as_text) == (15, 0, 0.0)
    assert s.looping_episodes == 1
    assert not s.rejected


def test_all_refused_run_has_no_metric(mixed_store):
    s = _summaries(mixed_store)[0]["gemma-vllm"]
    assert s.rejected
    for r in (s.call_fidelity, s.delivered_fidelity, s.paper_fidelity, s.restraint, s.answer_rate):
        assert r.pooled is None and r.episode_mean is None and r.ci_low is None and r.wilson_low is None
    assert s.non_response_rate.pooled == 1.0
    assert s.non_response_kinds == {"refused": 6}
    assert s.surfaced_as_text is None  # no call at all: undefined, not 0%


def test_calls_left_in_text_are_valid_but_not_delivered(mixed_store):
    sg = _summaries(mixed_store)[0]["qwen-sglang"]
    assert (sg.call_fidelity.numerator, sg.call_fidelity.denominator) == (3, 3)
    assert (sg.delivered_fidelity.numerator, sg.delivered_fidelity.denominator) == (1, 3)
    assert sg.lost_in_serving == pytest.approx(2 / 3)
    assert sg.roles["answer"] == 1


def test_text_surface_and_harness_saw_prose(mixed_store):
    runs, _ = _summaries(mixed_store)
    sg = runs["qwen-sglang"]
    assert (sg.calls, sg.text_calls, sg.harness_saw_prose, sg.valid_seen_as_prose) == (3, 2, 2, 2)
    assert sg.surfaced_as_text == pytest.approx(2 / 3)
    assert runs["qwen-text"].surfaced_as_text == 1.0


def test_run_selection_keeps_order_and_names_unknown_runs(mixed_store):
    runs, _ = _summaries(mixed_store, ["qwen-text", "gemma-vllm"])
    assert list(runs) == ["qwen-text", "gemma-vllm"]
    with pytest.raises(StoreError, match="unknown run.*qwen-txt.*runs in .*qwen-native"):
        _summaries(mixed_store, ["qwen-txt"])


def test_seed_makes_the_ci_reproducible(tmp_path):
    from storebuilder import Episode, Run, T

    # seven episodes with seven different rates (1/3, 2/4, ... 7/9): enough spread for a bootstrap
    episodes = [Episode(str(k), [T("valid_call")] * k + [T("invalid_args")] * 2) for k in range(1, 8)]
    path = build_store(tmp_path / "seven.duckdb", [Run("A", "ollama", "0.12.6", "qwen3:8b", "native", episodes)])
    a = _summaries(path, seed=0)[0]["A"].call_fidelity
    b = _summaries(path, seed=0)[0]["A"].call_fidelity
    c = _summaries(path, seed=5)[0]["A"].call_fidelity
    assert a.episodes_rated == 7 and a.interval_note is None
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)


def test_a_store_without_runs_says_so(tmp_path):
    path = build_store(tmp_path / "fresh.duckdb", [])
    with pytest.raises(StoreError, match="holds no runs yet"):
        load_report(path)


def test_outcome_list_matches_the_spec():
    assert set(OUTCOMES) == {"non_response", "hallucinated_call", "invalid_args", "valid_call", "unparseable", "prose"}


def test_a_run_with_no_turns_is_undefined_not_rejected(tmp_path):
    from storebuilder import Run

    from toolproxy.analysis.report import render

    path = build_store(tmp_path / "idle.duckdb", [Run("idle", "ollama", "0.12.6", "qwen3:8b", "native", [])])
    report = load_report(path)
    (s,) = report.runs
    assert (s.turns, s.episodes, s.rejected) == (0, 0, False)
    assert s.call_fidelity.pooled is None and s.non_response_rate.pooled is None
    row = render(report, "table").splitlines()[2].split()
    assert row[0] == "idle" and "rej" not in row and row[4:7] == ["-", "-", "-"]
    assert "idle: no turns recorded" in render(report, "table")
