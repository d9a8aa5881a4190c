"""The proxy benchmark runs end to end (one short round) in its pinned layout and its table adds up."""

from __future__ import annotations

import os
import shutil

import pytest
from benchrun import run_benchmark

from benchmarks.proxy import CHAT_BODY, FLOOR

pytestmark = pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (Debian: apt-get install wrk)")


def test_one_round_measures_every_target_pinned_and_records_every_exchange(tmp_path):
    out = tmp_path / "bench.json"
    r, result = run_benchmark(
        "proxy", ["--rounds", "1", "--seconds", "1", "--total", "10", "--c1-requests", "30"], out, timeout=300
    )
    nginx = shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")
    targets = {"direct", "toolproxy", "toolproxy_no_page", "playback", "bare_aiohttp", FLOOR} | (
        {"nginx"} if nginx else set()
    )
    assert set(result["medians"]) == targets
    for name, m in result["medians"].items():
        assert m["errors"] == 0 and m["c64_rps"] > 0 and m["c1_p50"] > 0 and m["c64_cpu_us"] > 0, (name, m)
    # every proxy's process tree measured; the page's classifier is a process of toolproxy's
    assert set(result["rss_tree_kb"]) == targets - {"direct"}
    assert result["rss_tree_kb"]["toolproxy"] > result["rss_tree_kb"]["toolproxy_no_page"] > 0
    stats = result["proxy_stats"]
    assert stats["recording"]["dropped"] == 0 and stats["recording"]["written"] >= stats["exchanges"] >= 10
    assert 1800 <= len(CHAT_BODY) <= 2000  # the rig's ~1.9 KB request
    two_cores = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2
    assert ("pinned: proxies and upstream on core" in r.stdout) == two_cores
    assert f"Against the floor ({FLOOR}" in r.stdout
    assert "| c64 throughput, playback vs serve | " in r.stdout
    for name in targets - {"direct", FLOOR}:
        assert f"| {name} | " in r.stdout.split("Against the floor")[1], name
