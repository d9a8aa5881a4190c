"""Per-run aggregates from a real DuckDB file with the analyzer's columns; numbers worked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.store import StoreError
from analysis.summary import OUTCOMES
from storebuilder import build_store, load_report


def _summaries(path: Path, runs=None, seed=0):
    report = load_report(path, runs, seed)
    return {s.run: s for s in report.runs}, report


def test_every_outcome_counted_and_fidelity_excludes_non_responses(mixed_store):
    runs, report = _summaries(mixed_store)
    assert list(runs) == ["gemma-vllm", "qwen-native", "qwen-sglang", "qwen-text"]
    s = runs["qwen-native"]
    assert (s.stack, s.stack_version, s.model, s.condition) == ("ollama", "0.12.6", "qwen3:8b", "native")
    assert (s.turns, s.episodes) == (20, 5)
    assert s.outcomes == {"valid_call": 12, "invalid_args": 2, "hallucinated_call": 1, "unparseable": 1,
                          "prose": 1, "non_response": 3}
    assert sum(s.outcome_shares.values()) == pytest.approx(1.0)
    assert s.non_response_kinds == {"http_5xx": 1, "timeout": 1, "retry_exhausted": 1}
    f = s.fidelity
    assert (f.produced, f.valid, f.non_responses) == (17, 12, 3)
    assert f.pooled == pytest.approx(12 / 17)
    assert f.non_response_rate == pytest.approx(3 / 20)
    # episode 4 produced nothing (timeout, then retries exhausted): no rate, counted apart
    assert f.episode_mean == pytest.approx((2 / 3 + 1 / 2 + 0 + 9 / 10) / 4)
    assert (f.episodes_rated, f.episodes_unrated) == (4, 1)
    assert f.ci_low < f.episode_mean < f.ci_high
    assert (s.calls, s.text_calls, s.surfaced_as_text) == (15, 0, 0.0)
    assert s.looping_episodes == 1
    assert not s.rejected


def test_all_refused_run_has_no_fidelity(mixed_store):
    s = _summaries(mixed_store)[0]["gemma-vllm"]
    assert s.rejected
    assert s.fidelity.pooled is None and s.fidelity.episode_mean is None
    assert s.fidelity.ci_low is None and s.fidelity.ci_high is None
    assert s.fidelity.non_response_rate == 1.0
    assert s.non_response_kinds == {"refused": 6}
    assert s.surfaced_as_text is None  # no call at all: undefined, not 0%


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


def test_seed_makes_the_ci_reproducible(mixed_store):
    a = _summaries(mixed_store, seed=0)[0]["qwen-native"].fidelity
    b = _summaries(mixed_store, seed=0)[0]["qwen-native"].fidelity
    c = _summaries(mixed_store, seed=5)[0]["qwen-native"].fidelity
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)


def test_a_store_without_runs_says_so(tmp_path):
    path = build_store(tmp_path / "fresh.duckdb", [])
    with pytest.raises(StoreError, match="holds no runs yet"):
        load_report(path)


def test_outcome_list_matches_the_spec():
    assert set(OUTCOMES) == {"non_response", "hallucinated_call", "invalid_args", "valid_call", "unparseable", "prose"}


def test_a_run_with_no_turns_is_undefined_not_rejected(tmp_path):
    from analysis.report import render
    from storebuilder import Run

    path = build_store(tmp_path / "idle.duckdb", [Run("idle", "ollama", "0.12.6", "qwen3:8b", "native", [])])
    report = load_report(path)
    (s,) = report.runs
    assert (s.turns, s.episodes, s.rejected) == (0, 0, False)
    assert s.fidelity.pooled is None and s.fidelity.non_response_rate is None
    row = render(report, "table").splitlines()[2].split()
    assert row[0] == "idle" and "rej" not in row and row[6:9] == ["-", "-", "-"]
    assert "idle: no turns recorded" in render(report, "table")
