"""examples/bfcl_style.py end to end: the harness's own score and toolproxy's delivered fidelity agree.

The stack is SGLang without a tool parser (it leaves every call in `content`), and the scripted
model is right on every item: the correct call where a tool fits, prose where none does. Under
`native` the harness therefore receives no call at all, under `text` toolproxy's condition hands it
every call: the benchmark's checker and the delivered fidelity must rank them the same way, while
call fidelity (which counts the calls left in text) calls them equal.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from toolproxy import emulators as fakes

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "bfcl_style.py"


def _example():
    spec = importlib.util.spec_from_file_location("bfcl_style", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _correct_model(items):
    def respond(req: fakes.ModelRequest) -> fakes.ScriptedReply:
        asked = json.dumps(req.messages)
        for _, question, _, expected in items:
            if json.dumps(question)[1:-1] in asked:
                if expected is None:
                    return fakes.text("None of my tools can answer that.")
                return fakes.call(expected[0], {k: v[0] for k, v in expected[1].items()})
        return fakes.text("?")

    return respond


def tp(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "toolproxy.cli", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_delivered_fidelity_ranks_conditions_as_the_harness_received_them(fake_stack, proxy, tmp_path):
    example = _example()
    n_call = sum(1 for item in example.ITEMS if item[3] is not None)
    n_none = len(example.ITEMS) - n_call
    fake = fake_stack("sglang", responder=_correct_model(example.ITEMS))
    p = proxy(fake.url, data=tmp_path / "data")
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--proxy", p.url, "--conditions", "native,text"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    received = dict(re.findall(r"harness received correctly under (\w+): (\d+)/", run.stdout))
    assert received == {"native": str(n_none), "text": str(len(example.ITEMS))}
    p.stop()

    tp("analyze", "--data", str(p.data))
    runs = {r["run"]: r for r in json.loads(tp("report", "--data", str(p.data), "--format", "json"))["runs"]}
    native, text = runs["bfcl-native"], runs["bfcl-text"]
    assert (native["call_fidelity"]["numerator"], native["call_fidelity"]["denominator"]) == (n_call, n_call)
    assert (native["delivered_fidelity"]["numerator"], native["delivered_fidelity"]["denominator"]) == (0, n_call)
    assert (text["delivered_fidelity"]["numerator"], text["delivered_fidelity"]["denominator"]) == (n_call, n_call)
    for r in (native, text):
        assert (r["restraint"]["numerator"], r["restraint"]["denominator"]) == (n_none, n_none)
        assert (r["delivered_restraint"]["numerator"], r["delivered_restraint"]["denominator"]) == (n_none, n_none)
        assert r["roles"]["abstain"] == n_none and r["roles"]["open"] == 0
    doc = json.loads(tp("compare", "bfcl-native", "bfcl-text", "--data", str(p.data), "--format", "json"))
    o = doc["overall"]
    assert (o["both_pass"], o["a_only"], o["b_only"]) == (n_none, 0, n_call)
    # A wildcard pattern pools the runs it matches; here each side matches one run, so the answer is the same.
    pooled = json.loads(tp("compare", "bfcl-nat*", "bfcl-t?xt", "--data", str(p.data), "--format", "json"))
    assert pooled["overall"] == o
    assert {
        r["run"] for r in json.loads(tp("report", "--data", str(p.data), "--run", "bfcl-*", "--format", "json"))["runs"]
    } == {"bfcl-native", "bfcl-text"}
    for args, said in (
        (("bfcl-*", "bfcl-text"), "include bfcl-text"),
        (("nope-*", "bfcl-text"), "unknown run(s): nope-*"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "toolproxy.cli", "compare", *args, "--data", str(p.data)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode != 0 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
