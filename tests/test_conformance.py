"""conformance against the fake stacks: pass counts per case and condition, gates (hard, advisory,
thresholds from a gates file), a flaky model at 17/20, transport failures shown as such, and the
CLI's exit codes as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest
from proxyprocess import together

from toolproxy.checks.cases import BY_NAME, CASES
from toolproxy.checks.conformance import (
    Cell,
    Gate,
    GatesError,
    decide,
    default_gates,
    parse_gates,
    render_markdown,
    report_path,
    run_conformance,
)
from toolproxy.checks.reply import read_reply
from toolproxy.emulators import ModelRequest, ScriptedReply, ToolCall, render_calls, text
from toolproxy.record.segments import read_records

CALLS = {
    "Tokyo": [("get_weather", {"city": "Tokyo"})],
    "flights from Paris to Rome": [("search_flights", {"origin": "Paris", "destination": "Rome"})],
    "Paris and in London": [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "London"})],
    "freezing": [("set_thermostat_mode", {"mode": "heat"})],
    "timer for 3": [("set_timer", {"minutes": 3})],
    "Launch party": [("create_event", {"title": "Launch party", "location": {"city": "Berlin", "country": "Germany"}})],
}
ANSWERS = {
    "temperature_c": "It is sunny and 18 °C in Paris.",
    "12 + 30": "42",
    "Book a table": "I cannot book restaurants; I can only look up the weather.",
}


def case_of(req: ModelRequest) -> str:
    """Which case a request is, from its conversation (the text condition rewrites the history)."""
    convo = " ".join(str(m.get("content") or "") for m in req.messages)
    for key in (*ANSWERS, *CALLS):
        if key in convo:
            return key
    raise AssertionError(f"unrecognised request: {convo[:200]}")


def answer(req: ModelRequest, calls: list[tuple[str, dict]] | None, prose: str | None) -> ScriptedReply:
    """The same intent, written the way the interface asks: native calls, text calls, or schema JSON."""
    if req.constraint is not None:
        obj = {"final_answer": prose} if calls is None else {"name": calls[0][0], "arguments": calls[0][1]}
        return text(json.dumps(obj))
    if calls is None:
        return text(prose)
    tcs = [ToolCall(n, a) for n, a in calls]
    if req.tools:
        return ScriptedReply(calls=tuple(tcs))
    return text(render_calls("hermes", tcs))


def good_model(req: ModelRequest) -> ScriptedReply:
    key = case_of(req)
    return answer(req, CALLS.get(key), ANSWERS.get(key))


def flaky_model(case_key: str, bad: ScriptedReply | list, every: int = 20, fails: int = 3):
    """Good, except that `fails` of every `every` requests of one case get the bad reply (17/20)."""
    seen = Counter()

    def respond(req: ModelRequest) -> ScriptedReply:
        key = case_of(req)
        seen[key] += 1
        if key == case_key and (seen[key] - 1) % every < fails:
            return answer(req, bad, None) if isinstance(bad, list) else bad
        return good_model(req)

    return respond


async def test_good_model_passes_every_gate_natively(fake_stack, tmp_path):
    fake = fake_stack("openai", responder=good_model)
    res = await run_conformance(fake.url, "gpt-4o-mini", ["native"], "native", 3, default_gates(), tmp_path / "d")
    assert {name: (c.passes, c.runs) for name, c in res.cells["native"].items()} == {c.name: (3, 3) for c in CASES}
    assert res.exit_code == 0 and res.passing == ["native"]
    md = render_markdown(res)
    assert "| required_argument | hard ≥100% | 3/3 |" in md
    assert "Result: native passes every hard gate; conditions passing every hard gate: native." in md
    recs = read_records(tmp_path / "d", "exchange")
    assert len(recs) == 3 * len(CASES)
    assert {r["run"] for r in recs} == {"conformance-native"}
    assert Counter(r["item"] for r in recs) == {c.name: 3 for c in CASES}


async def test_conditions_side_by_side_vllm_without_parser(fake_stack, tmp_path):
    """vLLM launched without a tool parser: native is refused, the text condition passes every hard gate."""
    fake = fake_stack("vllm", responder=good_model)
    res = await run_conformance(
        fake.url,
        "Qwen/Qwen2.5-7B-Instruct",
        ["native", "text", "constrained"],
        "native",
        2,
        default_gates(),
        tmp_path / "d",
    )
    native = res.cells["native"]
    assert native["required_argument"].refused == 2 and native["required_argument"].passes == 0
    # the refusal is a measured failure of every case (the model never ran), not a transport problem
    assert all(c.transport == 0 and c.refused == 2 for c in native.values())
    assert res.status("native") == "fail" and res.exit_code == 1
    assert all(c.passes == 2 for c in res.cells["text"].values()), {k: c.reasons for k, c in res.cells["text"].items()}
    assert res.status("text") == "pass"
    assert "text" in res.passing and "native" not in res.passing
    md = render_markdown(res)
    assert "| no_tool_needed | hard ≥100% | 0/2 (2 refused) ✗ | 2/2 |" in md
    assert "Result: hard gate failed under native; conditions passing every hard gate: text" in md
    assert 'native / every case: HTTP 400: "auto" tool choice requires --enable-auto-tool-choice' in md
    assert "native / required_argument" not in md
    runs = {r["run"] for r in read_records(tmp_path / "d", "exchange")}
    assert runs == {"conformance-native", "conformance-text", "conformance-constrained"}


@pytest.mark.parametrize(
    "case_key, bad, case, passes",
    [
        ("Tokyo", [("get_weather", {"town": "Tokyo"})], "required_argument", 17),
        ("timer for 3", [("set_timer", {"minutes": 3.0})], "integer_argument", 17),
        ("freezing", [("set_thermostat_mode", {"mode": "warm"})], "enum_value", 17),
        (
            "flights from Paris to Rome",
            [("search_flights", {"origin": "Paris", "destination": "Rome", "date": "05-03"})],
            "no_extra_properties",
            17,
        ),
        ("12 + 30", [("get_weather", {"city": "Paris"})], "no_tool_needed", 17),
        ("Book a table", [("book_table", {"people": 2})], "missing_tool", 17),
        (
            "Launch party",
            [("create_event", {"title": "Launch party", "location": "Berlin, Germany"})],
            "nested_object",
            17,
        ),
        ("temperature_c", [("get_weather", {"city": "Paris"})], "tool_result_answer", 17),
    ],
)
async def test_flaky_model_17_of_20_fails_its_gate(fake_stack, tmp_path, case_key, bad, case, passes):
    fake = fake_stack("openai", responder=flaky_model(case_key, bad))
    res = await run_conformance(
        fake.url, "gpt-4o-mini", ["native"], "native", 20, default_gates(), tmp_path / "d", concurrency=4
    )
    cell = res.cells["native"][case]
    assert (cell.passes, cell.runs) == (passes, 20), cell.reasons
    assert sum(cell.reasons.values()) == 3
    assert all(c.passes == 20 for name, c in res.cells["native"].items() if name != case)
    assert decide(cell, res.gates[case]) == "fail"
    assert res.exit_code == 1
    assert f"| {case} | hard" in render_markdown(res) and "17/20 ✗" in render_markdown(res)


async def test_calls_left_as_text_are_named_as_such(fake_stack, tmp_path):
    """SGLang without a parser: the model calls, the harness gets text; the reason says which."""
    fake = fake_stack("sglang", responder=good_model)
    res = await run_conformance(
        fake.url, "Qwen/Qwen2.5-7B-Instruct", ["native"], "native", 1, default_gates(), tmp_path / "d"
    )
    cell = res.cells["native"]["required_argument"]
    assert cell.passes == 0
    assert cell.reasons == {"the call to get_weather was left as text in content (the stack did not extract it)": 1}
    assert res.cells["native"]["no_tool_needed"].passes == 1 and res.exit_code == 1


async def test_flaky_advisory_gate_does_not_fail_the_run(fake_stack, tmp_path):
    fake = fake_stack(
        "openai", responder=flaky_model("Paris and in London", [("get_weather", {"city": "Paris"})], fails=12)
    )
    res = await run_conformance(
        fake.url, "gpt-4o-mini", ["native"], "native", 20, default_gates(), tmp_path / "d", concurrency=4
    )
    cell = res.cells["native"]["two_targets"]
    assert (cell.passes, cell.runs) == (8, 20)
    assert decide(cell, res.gates["two_targets"]) == "fail" and res.exit_code == 0
    assert "| two_targets | advisory ≥50% | 8/20 ✗ |" in render_markdown(res)


@pytest.mark.parametrize(
    "cell, gate, outcome",
    [
        (Cell(runs=20, passes=20), Gate("hard", 1.0), "pass"),
        (Cell(runs=20, passes=19), Gate("hard", 1.0), "fail"),
        (Cell(runs=20, passes=18), Gate("hard", 0.9), "pass"),
        (Cell(runs=20, passes=17), Gate("hard", 0.9), "fail"),
        (Cell(runs=20, passes=17), Gate("hard", 0.85), "pass"),
        (Cell(runs=20, passes=17, transport=3), Gate("hard", 1.0), "unknown"),  # all 3 passing would reach 100%
        (Cell(runs=20, passes=15, transport=3), Gate("hard", 1.0), "fail"),  # cannot reach it whatever they were
        (Cell(runs=20, passes=18, skipped=2), Gate("hard", 0.9), "pass"),  # already there
        (Cell(runs=20, transport=20), Gate("hard", 0.9), "unknown"),
        (Cell(), Gate("hard", 0.9), "unknown"),
    ],
)
def test_gate_decision(cell, gate, outcome):
    assert decide(cell, gate) == outcome


def test_cell_counts_transport_apart_from_refusals():
    cell = Cell()
    probe = type("P", (), {})
    for status, body, kind in [
        (502, b'{"error":{"message":"cannot connect"}}', "connect"),
        (400, b'{"error":{"message":"x does not support tools"}}', None),
        (200, b'{"choices":[{"message":{"content":"42"},"finish_reason":"stop"}]}', None),
    ]:
        p = probe()
        p.reply, p.condition_skipped = read_reply(status, body, kind), None
        cell.add(p, BY_NAME["no_tool_needed"])
    assert (cell.runs, cell.passes, cell.refused, cell.transport) == (3, 1, 1, 1)


def test_gates_file_parsing():
    base = default_gates()
    assert base["no_extra_properties"] == Gate("hard", 0.9) and base["two_targets"].level == "advisory"
    assert set(base) == set(BY_NAME)
    over = parse_gates({"required_argument": {"min_pass_rate": 0.85}, "two_targets": {"level": "hard"}}, base)
    assert over["required_argument"] == Gate("hard", 0.85) and over["two_targets"] == Gate("hard", 0.5)
    for bad, message in [
        ({"nope": {}}, "unknown case 'nope'"),
        ({"enum_value": {"level": "soft"}}, "enum_value.level: Input should be 'hard' or 'advisory' (got 'soft')"),
        (
            {"enum_value": {"min_pass_rate": 1.5}},
            "enum_value.min_pass_rate: Input should be less than or equal to 1 (got 1.5)",
        ),
        (
            {"enum_value": {"min_pass_rate": True}},
            "enum_value.min_pass_rate: Input should be a valid number (got True)",
        ),
        (
            {"enum_value": {"min_pass_rate": "0.9"}},
            "enum_value.min_pass_rate: Input should be a valid number (got '0.9')",
        ),
        (
            {"enum_value": {"min_pass_rat": 0.5}},
            "enum_value: unknown field 'min_pass_rat'; a gate has level and min_pass_rate",
        ),
        ([], "a gates file is a JSON object"),
        ({"enum_value": 3}, "enum_value: expected an object with level and/or min_pass_rate (got 3)"),
        (
            {"enum_value": {"level": "x"}, "two_targets": {"min_pass_rate": -1}},
            "enum_value.level: Input should be 'hard' or 'advisory' (got 'x'); two_targets.min_pass_rate: Input "
            "should be "
            "greater than or equal to 0 (got -1)",
        ),
    ]:
        with pytest.raises(GatesError) as raised:
            parse_gates(bad, base)
        assert str(raised.value).startswith(message), str(raised.value)
    with pytest.raises(GatesError, match="required_argument: give both level and min_pass_rate"):
        parse_gates({"required_argument": {"level": "hard"}})
    assert parse_gates({"enum_value": {"min_pass_rate": 1}}, base)["enum_value"] == Gate("hard", 1.0)


def test_the_report_is_dated_under_the_data_dir():
    import datetime

    assert (
        str(report_path(Path("d"), "Qwen/Qwen2.5 7B:q4", datetime.date(2026, 11, 29)))
        == "d/conformance/2026-11-29-conformance-Qwen-Qwen2.5-7B-q4.md"
    )


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", "conformance", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_cli_exit_codes(fake_stack, tmp_path):
    good = fake_stack("openai", responder=good_model)
    out = tmp_path / "good.md"
    # The flaky model fails 3 of every 20 requests it sees: one fake per run, as the runs go side by side.
    flaky = [fake_stack("openai", responder=flaky_model("Tokyo", [("get_weather", {})])) for _ in range(2)]
    args = [
        (
            "--upstream",
            f.url,
            "--model",
            "gpt-4o-mini",
            "--runs",
            "20",
            "--concurrency",
            "4",
            "--data",
            str(tmp_path / f"d2-{i}"),
        )
        for i, f in enumerate(flaky)
    ]
    gates = tmp_path / "gates.json"
    gates.write_text(orjson.dumps({"required_argument": {"min_pass_rate": 0.85}}).decode())
    r_good, r_flaky, r_gated, r_down = together(
        lambda: cli(
            "--upstream",
            good.url,
            "--model",
            "gpt-4o-mini",
            "--runs",
            "2",
            "--data",
            str(tmp_path / "d"),
            "-o",
            str(out),
        ),
        lambda: cli(*args[0], "-o", str(tmp_path / "flaky.md")),
        lambda: cli(*args[1], "-o", str(tmp_path / "flaky2.md"), "--gates", str(gates)),
        lambda: cli(
            "--upstream",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--data",
            str(tmp_path / "d3"),
            "-o",
            str(tmp_path / "x.md"),
        ),
    )
    assert r_good.returncode == 0, r_good.stdout + r_good.stderr
    assert out.read_text() == r_good.stdout.split("written to")[0]
    assert "Result: native passes every hard gate" in r_good.stdout

    assert r_flaky.returncode == 1, r_flaky.stdout + r_flaky.stderr
    assert "| required_argument | hard ≥100% | 17/20 ✗ |" in r_flaky.stdout
    assert r_gated.returncode == 0, r_gated.stdout + r_gated.stderr
    assert "| required_argument | hard ≥85% | 17/20 |" in r_gated.stdout

    # endpoint down: a transport problem, exit 2, no traceback, nothing counted as a failed case
    assert r_down.returncode == 2 and "cannot connect to http://127.0.0.1:9" in r_down.stderr
    assert "Traceback" not in r_down.stderr and not (tmp_path / "x.md").exists()


def test_cli_defaults_three_runs_an_estimate_and_the_data_dir(fake_stack, tmp_path):
    """Twenty runs a case was 70 minutes on a CPU model, written into runs/ in the current
    directory; three, with an estimate once the first answer is in, kept beside the recordings."""
    good = fake_stack("openai", responder=good_model)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "conformance",
            "--upstream",
            good.url,
            "--model",
            "gpt-4o-mini",
            "--data",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(CASES) * 3
    first, estimate = r.stderr.splitlines()
    assert first == f"toolproxy conformance: {n} requests ({len(CASES)} cases x 3 runs x 1 condition)"
    assert re.fullmatch(
        rf"toolproxy conformance: the first answer took \d+\.\ds; at that pace all {n} requests take "
        r"about \S+ \(--runs sets the runs per case\)",
        estimate,
    ), estimate
    assert not (tmp_path / "runs").exists()
    written = list((tmp_path / "d" / "conformance").glob("*-conformance-gpt-4o-mini.md"))
    assert len(written) == 1 and "| case | gate | native |" in written[0].read_text()
    assert "- 3 runs per case and condition" in written[0].read_text()
    assert len([rec for rec in read_records(tmp_path / "d", "exchange") if rec["run"] == "conformance-native"]) == n


async def test_transport_failures_shown_as_such_not_as_failed_cases(fake_stack, tmp_path):
    """The upstream stalls past the timeout for some requests: those runs are unmeasured."""
    from toolproxy.emulators import stall

    fake = fake_stack("openai", responder=good_model)
    fake.inject(stall(before=6.0, times=2, path="/v1/chat/completions"))
    # 2.5s: far above a fake's answer even on a loaded CI machine, far below the stall.
    res = await run_conformance(
        fake.url, "gpt-4o-mini", ["native"], "native", 1, default_gates(), tmp_path / "d", timeout=2.5
    )
    cells = res.cells["native"]
    assert sum(c.transport for c in cells.values()) == 2
    assert sum(c.passes for c in cells.values()) == len(CASES) - 2
    assert all(not c.reasons for c in cells.values()), "a timeout is never a failed case"
    assert res.exit_code == 2
    assert "transport x1" in render_markdown(res)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--conditions", "native,bogus"), "unknown condition 'bogus'"),
        (("--conditions", "text", "--gate-on", "native"), "--gate-on 'native' must be one of --conditions"),
        (("--runs", "0"), "0 is not in the range"),
    ],
)
def test_cli_usage_errors(tmp_path, args, message):
    r = cli("--upstream", "http://127.0.0.1:9", "--model", "m", "--data", str(tmp_path / "d"), *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_cli_bad_gates_file(tmp_path):
    bad = tmp_path / "g.json"
    bad.write_text('{"enum_value": {"level": "soft"}}')
    r = cli("--upstream", "http://127.0.0.1:9", "--model", "m", "--gates", str(bad))
    assert r.returncode == 2 and "enum_value.level: Input should be 'hard' or 'advisory' (got 'soft')" in r.stderr


def test_cli_output_is_inert(fake_stack, tmp_path):
    good = fake_stack("openai", responder=good_model)
    out = tmp_path / "r.md"
    r = cli(
        "--upstream",
        good.url,
        "--model",
        "gpt\x1b]0;owned\x07\u202e",
        "--runs",
        "1",
        "--data",
        str(tmp_path / "d"),
        "-o",
        str(out),
    )
    assert "# Conformance: gpt\\x1b]0;owned\\x07\\u202e on" in r.stdout, r.stdout + r.stderr
    assert not any(c in r.stdout + out.read_text() for c in "\x1b\x07\u202e")


def test_progress_line_on_a_terminal_only(fake_stack, tmp_path):
    """Without --quiet: a progress line with counts, rate and time left on a terminal; none in a pipe."""
    from ptyrun import REDRAW, on_a_terminal

    good = fake_stack("openai", responder=good_model)
    args = ["--upstream", good.url, "--model", "gpt-4o-mini", "--runs", "2"]
    cmd = [sys.executable, "-c", "from toolproxy.cli import main; main()", "conformance", *args]
    rc, stdout, tty = on_a_terminal([*cmd, "--data", str(tmp_path / "d"), "-o", str(tmp_path / "a.md")])
    assert rc == 0, tty
    assert re.search(rb"\r\x1b\[2Kconformance: \d+/\d+ requests \(\d+%\), [\d.,]+ requests/(s|min), \S+ left", tty), tty
    assert REDRAW + b"conformance: " in tty and b"(100%)" in tty and b"done in" in tty
    assert REDRAW not in stdout
    piped = subprocess.run(
        [*cmd, "--data", str(tmp_path / "e"), "-o", str(tmp_path / "b.md")], capture_output=True, timeout=300
    )
    assert piped.returncode == 0 and REDRAW not in piped.stderr and b"requests/" not in piped.stderr
