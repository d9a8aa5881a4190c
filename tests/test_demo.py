"""README's first command runs `toolproxy demo`: it must work end to end and tell the stacks apart."""

import re
import subprocess
import sys


def test_demo_records_analyzes_and_reports(tmp_path):
    data = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "demo", "--data", str(data), "--episodes", "5"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    table = out[out.index("$ toolproxy report") :]
    rows = {
        line.split()[0]: line.split()
        for line in table.splitlines()
        if re.match(r"^(ollama|vllm|sglang|openai)-[a-z]+ +(native|text) ", line)
    }
    assert set(rows) == {
        "ollama-qwen",
        "ollama-gemma",
        "vllm-default",
        "sglang-noparser",
        "sglang-text",
        "openai-halluc",
    }

    def headline(run):  # call, delivered, lost, restraint, delivered restraint, answered, non-response
        cells = rows[run][4:]
        return [c for c in cells if not c.startswith("[")]

    # The ideal stack: a correct agent gets full marks (it scored 40% when a final answer counted as a miss).
    assert headline("ollama-qwen") == ["100%", "100%", "0%", "100%", "100%", "100%", "0%"]
    # No parser: every call was valid, none reached the harness; the text condition restores delivery.
    assert headline("sglang-noparser") == ["100%", "0%", "100%", "100%", "100%", "0%", "0%"]
    assert headline("sglang-text") == ["100%", "100%", "0%", "100%", "100%", "100%", "0%"]
    # Refusals are "rej" (no metric), never 0%.
    assert headline("vllm-default") == ["rej"] * 6 + ["100%"]
    assert headline("ollama-gemma") == ["rej"] * 6 + ["100%"]
    assert "0% [0-0]" not in out
    assert "lost in the serving layer: calls left in text" in out
    # The line per run says the same: the lost calls, and rej with the stack's own words.
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  run ")}
    assert (
        "delivered 0% [" in lines["run sglang-noparser"]
        and "valid calls left in text, lost in serving" in lines["run sglang-noparser"]
    )
    assert (
        ": rej: every one a non-response" in lines["run vllm-default"]
        and "--enable-auto-tool-choice" in lines["run vllm-default"]
    )
    # compare agrees: the broken arm never wins (it won 4-0 when calls left in text counted).
    compare = out[out.index("$ toolproxy compare sglang-noparser sglang-text") :]
    assert "metric delivered" in compare
    overall = next(line.split() for line in compare.splitlines() if line.startswith("all "))
    paired, both, a_only, b_only = map(int, overall[1:5])
    assert a_only == 0 and b_only == 4 and both == 1 and paired == 5
    assert (data / "report.html").stat().st_size > 5000
    # Re-running over its own directory is allowed; a foreign non-empty directory is refused.
    other = tmp_path / "precious"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    refused = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "demo", "--data", str(other)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "not a previous demo" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert (other / "keep.txt").exists()
