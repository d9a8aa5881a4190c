"""The analysis of a fixed generated data dir concludes exactly what it did when the golden summary
was written (tests/data/analysis_golden.json, made by the analyzer before its ingest was rebuilt
for speed). A change that alters any classification, turn, role, episode, run or metric fails
here; when that is intended, ANALYZER_VERSION goes up and the golden file is rewritten with it.

    python tests/analysis/test_golden.py --write   # rewrite the golden file
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from golden import summary  # noqa: E402

from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
from toolproxy.testing.corpus import generate

GOLDEN = Path(__file__).parent.parent / "data" / "analysis_golden.json"
EXCHANGES = 3000


def _analyzed(data: Path, *extra: str) -> dict:
    generate(data, EXCHANGES, seed=7, segment_records=1000)
    cmd = [sys.executable, "-m", "toolproxy.cli", "analyze", "--data", str(data), "--quiet", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    with duckdb.connect(str(data / "toolproxy.duckdb"), read_only=True) as con:
        return {"analyzer_version": ANALYZER_VERSION, "exchanges": EXCHANGES, "summary": summary(con)}


def test_generated_data_analyses_as_the_golden_summary_says(tmp_path: Path) -> None:
    got = _analyzed(tmp_path)
    want = json.loads(GOLDEN.read_text())
    assert got["analyzer_version"] == want["analyzer_version"], "ANALYZER_VERSION changed: rewrite the golden file"
    for part in want["summary"]:
        assert got["summary"][part] == want["summary"][part], part


def test_worker_processes_conclude_the_same(tmp_path: Path) -> None:
    got = _analyzed(tmp_path, "--workers", "2", "--batch-mb", "1")
    assert got["summary"] == json.loads(GOLDEN.read_text())["summary"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        GOLDEN.write_text(json.dumps(_analyzed(Path(d)), indent=0, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
