"""The stdio MCP relay benchmark runs end to end (small) and records every call it relays."""

from __future__ import annotations

from benchrun import run_benchmark


def test_a_small_run_times_both_targets_and_loses_no_record(tmp_path):
    r, result = run_benchmark("mcp", ["--messages", "100", "--rounds", "2"], tmp_path / "mcp.json", timeout=240)
    assert result["recorded"] == result["expected_records"] == 300
    assert set(result["per_round_ms"]) == {"direct", "toolproxy"}
    assert all(len(v) == 2 and min(v) > 0 for v in result["per_round_ms"].values())
    assert "added per message" in r.stdout and "| toolproxy mcp |" in r.stdout
