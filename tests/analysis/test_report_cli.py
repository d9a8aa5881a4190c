"""`toolproxy report` and `toolproxy compare` run as the user runs them: a subprocess on a real store."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from proxyprocess import together
from storebuilder import Episode, Run, T, build_store, paired_runs

from toolproxy.analysis.measure.stats import holm, mcnemar_exact

TOOLPROXY = shutil.which("toolproxy", path=str(Path(sys.executable).parent)) or shutil.which("toolproxy")


def toolproxy(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    assert TOOLPROXY, "the toolproxy console script is not installed (pip install -e .)"
    return subprocess.run([TOOLPROXY, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def assert_user_error(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_report_reads_the_default_data_dir(mixed_store, tmp_path):
    # mixed_store is tmp_path/toolproxy.duckdb; run from a dir whose ./toolproxy-data holds it
    data = tmp_path / "work" / "toolproxy-data"
    data.mkdir(parents=True)
    shutil.copy(mixed_store, data / "toolproxy.duckdb")
    proc = toolproxy("report", cwd=tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split()[:2] == ["run", "cond"]
    gemma = next(line for line in proc.stdout.splitlines() if line.startswith("gemma-vllm"))
    assert gemma.split()[6:8] == ["rej", "rej"]


@pytest.mark.parametrize("fmt", ["markdown", "json", "csv", "html"])
def test_report_writes_each_format_to_a_file(mixed_store, tmp_path, fmt):
    out = tmp_path / f"report.{fmt}"
    proc = toolproxy("report", "--db", str(mixed_store), "--format", fmt, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and f"wrote {out}" in proc.stderr
    text = out.read_text(encoding="utf-8")
    assert "qwen-sglang" in text and "gemma-vllm" in text


def test_report_run_filter_and_seed(mixed_store):
    proc = toolproxy("report", "--db", str(mixed_store), "--format", "json", "--run", "qwen-text", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["run"] for r in doc["runs"]] == ["qwen-text"] and doc["bootstrap"]["seed"] == 3
    again = json.loads(
        toolproxy("report", "--db", str(mixed_store), "--format", "json", "--run", "qwen-text", "--seed", "3").stdout
    )
    assert again["runs"] == doc["runs"]


def test_report_user_errors(mixed_store, tmp_path):
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    no_rows = build_store(tmp_path / "no-rows.duckdb", [])
    cases = [
        (("--data", str(tmp_path / "nowhere")), "no data directory at"),
        (("--db", str(mixed_store), "--run", "qwen-nativ"), "unknown run(s): qwen-nativ"),
        (("--db", str(empty)), "run `toolproxy analyze`"),
        (("--db", str(no_rows)), "holds no runs yet"),
        (("--db", str(mixed_store), "--format", "html", "-o", str(tmp_path / "no" / "r.html")), "cannot write"),
    ]
    done = together(*[lambda args=args: toolproxy("report", *args) for args, _ in cases])  # read-only: side by side
    for (_, says), r in zip(cases, done):
        assert_user_error(r, says)


def _compare_json(db: Path, *args: str) -> dict:
    proc = toolproxy("compare", *args, "--db", str(db), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_compare_reproduces_the_published_figure(tmp_path):
    db = build_store(tmp_path / "pub.duckdb", paired_runs({"all": (40, 70, 25, 15)}))
    doc = _compare_json(db, "A", "B")
    o = doc["overall"]
    assert (o["paired"], o["both_pass"], o["a_only"], o["b_only"], o["both_fail"]) == (150, 40, 70, 25, 15)
    assert o["p"] == pytest.approx(4.271012269463366e-06, rel=1e-9)
    table = toolproxy("compare", "A", "B", "--db", str(db)).stdout
    assert "4.3e-06" in table and " 70 " in table and " 25 " in table


def test_compare_by_category_with_holm(tmp_path):
    counts = {"simple": (10, 7, 1, 2), "multiple": (5, 2, 3, 0), "parallel": (3, 66, 40, 1)}
    db = build_store(tmp_path / "cat.duckdb", paired_runs(counts))
    doc = _compare_json(db, "A", "B", "--by", "category")
    rows = {r["label"]: r for r in doc["categories"]}
    assert list(rows) == sorted(counts)
    raw = {c: mcnemar_exact(v[1], v[2]) for c, v in counts.items()}
    assert rows["simple"]["p"] == pytest.approx(0.0703125)  # 2 * (1 + 8) / 2**8
    assert rows["parallel"]["p"] == pytest.approx(0.01477941051703841)  # published: 66 vs 40
    adjusted = dict(zip(sorted(counts), holm([raw[c] for c in sorted(counts)])))
    for c, (both, a_only, b_only, neither) in counts.items():
        r = rows[c]
        assert (r["paired"], r["both_pass"], r["a_only"], r["b_only"], r["both_fail"]) == (
            both + a_only + b_only + neither,
            both,
            a_only,
            b_only,
            neither,
        )
        assert r["p_holm"] == pytest.approx(adjusted[c])
    assert doc["overall"]["a_only"] == 75 and doc["overall"]["b_only"] == 44
    text = toolproxy("compare", "A", "B", "--by", "category", "--db", str(db)).stdout
    assert "Holm p" in text and "Holm-adjusted" in text
    assert all(len(line) <= 100 for line in text.splitlines())


def test_compare_metrics_differ_on_agent_episodes(mixed_store):
    # bfcl:simple_1 in qwen-native calls twice, then answers: all-valid fails it for the answer;
    # delivered and call pass it, as a correct agent deserves.
    expected = {
        "delivered": (1, 0, 2, 1),
        "call": (1, 0, 2, 1),
        "all-valid": (0, 0, 3, 1),
        "any-valid": (3, 0, 0, 1),
        "clean": (1, 0, 2, 1),
    }
    for metric, (both, a_only, b_only, neither) in expected.items():
        doc = _compare_json(mixed_store, "qwen-native", "qwen-text", "--metric", metric)
        o = doc["overall"]
        assert (o["both_pass"], o["a_only"], o["b_only"], o["both_fail"]) == (both, a_only, b_only, neither), metric
        assert (doc["only_in_a"], doc["only_in_b"]) == (1, 0)
        assert doc["metric"] == metric and doc["metric_rule"]
    assert _compare_json(mixed_store, "qwen-native", "qwen-text")["metric"] == "delivered"  # the default


def test_compare_user_errors(mixed_store, tmp_path):
    assert_user_error(toolproxy("compare", "qwen-native", "nope", "--db", str(mixed_store)), "unknown run(s): nope")
    assert_user_error(toolproxy("compare", "qwen-text", "qwen-text", "--db", str(mixed_store)), "two different runs")
    assert_user_error(toolproxy("compare", "a", "b", "--data", str(tmp_path / "empty")), "no data directory at")
    disjoint = build_store(
        tmp_path / "disjoint.duckdb",
        [
            Run("x", "ollama", "0.12.6", "m", "native", [Episode("0", [T("valid_call")], "item-1", "simple")]),
            Run("y", "ollama", "0.12.6", "m", "text", [Episode("0", [T("valid_call")], "item-2", "simple")]),
        ],
    )
    assert_user_error(toolproxy("compare", "x", "y", "--db", str(disjoint)), "no item is present in both")


def test_delivered_judges_an_item_expecting_no_call_by_what_reached_the_harness(tmp_path):
    """A call written in text that no parser extracted never reached the harness: under `delivered`
    that is the restraint the harness saw (as BFCL's irrelevance scoring sees it); under `call` the
    model still attempted a call. A failed call that came in tool_calls did reach the harness."""

    def run(name: str, turn: str) -> Run:
        return Run(
            name,
            "llamacpp",
            "b1",
            "m",
            "native",
            [Episode(str(i), [T(turn)], f"irrelevance_{i}", "irrelevance", expect="none") for i in range(3)],
        )

    db = build_store(
        tmp_path / "irr.duckdb",
        [
            run("left-in-text", "valid_call@text!"),
            run("parsed", "valid_call@text"),
            run("structured-bad", "invalid_args"),
            run("declined", "prose"),
        ],
    )

    def overall(a: str, b: str, *metric: str) -> tuple:
        proc = toolproxy("compare", a, b, "--db", str(db), "--format", "json", *metric)
        assert proc.returncode == 0, proc.stderr
        o = json.loads(proc.stdout)["overall"]
        return o["both_pass"], o["a_only"], o["b_only"], o["both_fail"]

    assert overall("left-in-text", "parsed") == (0, 3, 0, 0)
    assert overall("left-in-text", "declined") == (3, 0, 0, 0)
    assert overall("structured-bad", "declined") == (0, 0, 3, 0)
    assert overall("left-in-text", "parsed", "--metric", "call") == (0, 0, 0, 3)
    assert overall("left-in-text", "declined", "--metric", "call") == (0, 0, 3, 0)
