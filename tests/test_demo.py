"""README's first command runs `toolproxy demo`: it must work end to end and tell the stacks apart."""

import re
import subprocess
import sys


def test_demo_records_analyzes_and_reports(tmp_path):
    data = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "toolproxy.cli", "demo", "--data", str(data), "--episodes", "3"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    rows = {line.split()[0]: line for line in out.splitlines() if re.match(r"^(ollama|vllm|sglang|openai)-[a-z]+ ", line)}
    assert set(rows) == {"ollama-qwen", "ollama-gemma", "vllm-default", "sglang-noparser", "sglang-text", "openai-halluc"}
    # Refusals are "rej" (no fidelity), never 0%.
    assert re.search(r"\brej\s+rej\s+100%", rows["vllm-default"])
    assert re.search(r"\brej\s+rej\s+100%", rows["ollama-gemma"])
    # SGLang without a parser: every call surfaced as text; the harness saw prose.
    assert rows["sglang-noparser"].split()[-2] == "100%"
    assert "held a valid call in the text" in out
    assert (data / "report.html").stat().st_size > 5000
    # Re-running over its own directory is allowed; a foreign non-empty directory is refused.
    other = tmp_path / "precious"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    refused = subprocess.run([sys.executable, "-m", "toolproxy.cli", "demo", "--data", str(other)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "not a previous demo" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert (other / "keep.txt").exists()
