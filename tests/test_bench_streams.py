"""The concurrent-streams benchmark runs end to end (small and short) and its numbers add up."""

from __future__ import annotations

import shutil

from benchrun import run_benchmark


def test_a_small_burst_through_every_target_completes_and_loses_no_record(tmp_path):
    out = tmp_path / "streams.json"
    r, result = run_benchmark(
        "streams", ["--streams", "40", "--rate", "20", "--seconds", "1", "--workers", "1,2"], out, timeout=240
    )
    targets = {"direct", "toolproxy", "toolproxy_w2", "bare_aiohttp"} | ({"nginx"} if shutil.which("nginx") else set())
    assert {k.split("@")[0] for k in result["raw"]} == targets
    for key, runs in result["raw"].items():
        (run,) = runs
        assert run["complete"] == 40 and run["statuses"] == {"200": 40} and run["short"] == 0, (key, run)
        assert run["events"] == 40 * 20, key  # every event of every stream arrived and was timed
        assert 0 <= run["ttfb_p50_ms"] <= run["ttfb_p99_ms"] and 0 <= run["delay_p50_ms"] <= run["delay_p99_ms"]
        assert run["wall_s"] >= 0.95  # twenty events at 20/s cannot arrive sooner
    assert result["records_lost"] == {"toolproxy@40": 0, "toolproxy_w2@40": 0}
    for name in targets:
        assert f"| 40 | {name} |" in r.stdout
