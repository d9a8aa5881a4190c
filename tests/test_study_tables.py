"""`toolproxy report --study`: the study's tables from a known recording, made by one study over
two emulated launches of llama.cpp (one refuses tools) and two models whose answers are scripted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from toolproxy import emulators as fakes

CITIES = ("Paris", "Lima", "Oslo", "Rome", "Kyiv", "Cairo")
# One task per city; the harness acts only on structured tool_calls.
HARNESS = textwrap.dedent(f"""
    import os
    from openai import OpenAI
    tools = [{{"type": "function", "function": {{"name": "get_weather", "parameters": {{
        "type": "object", "properties": {{"city": {{"type": "string"}}}}, "required": ["city"],
        "additionalProperties": False}}}}}}]
    base = os.environ["TOOLPROXY_BASE_URL"]
    for i, city in enumerate({CITIES!r}):
        c = OpenAI(base_url=f"{{base}}/episode={{i}}/item={{city}}/v1", max_retries=0)
        messages = [{{"role": "user", "content": f"Weather in {{city}}?"}}]
        for _ in range(3):
            try:
                msg = c.chat.completions.create(model="harness-model", messages=messages,
                                                tools=tools).choices[0].message
            except Exception as exc:
                print("error answer:", exc)
                break
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            for t in msg.tool_calls:
                messages.append({{"role": "tool", "tool_call_id": t.id, "content": "sunny"}})
""")


def _responder(req: fakes.ModelRequest) -> fakes.ScriptedReply:
    """m-ok calls for every city (Oslo and Rome with a wrong argument): per-episode fidelity varies.
    m-few answers four cities in prose without trying: only two episodes are due a call."""
    last = (req.messages or [{}])[-1]
    if last.get("role") == "tool" or "sunny" in str(last.get("content")):
        return fakes.text("It is sunny.")
    city = str(last.get("content", "")).split()[-1].rstrip("?")
    if req.model == "m-few" and city not in ("Paris", "Lima"):
        return fakes.text(f"I do not know the weather in {city}.")
    if city in ("Oslo", "Rome"):
        return fakes.call("get_weather", {"town": city})
    return fakes.call("get_weather", {"city": city})


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tables")
    harness = tmp / "agent.py"
    harness.write_text(HARNESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    data = tmp / "data"
    jinja, nojinja = (
        fakes.FakeStack("llamacpp", responder=_responder),
        fakes.FakeStack("no_jinja", responder=_responder),
    )
    with jinja.in_thread(), nojinja.in_thread():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "toolproxy.cli",
                "study",
                "--upstream",
                f"jinja={jinja.url}",
                "--upstream",
                f"nojinja={nojinja.url}",
                "--model",
                "m-ok",
                "--model",
                "m-few",
                "--conditions",
                "native,text",
                "--data",
                str(data),
                "--name",
                "t",
                "--",
                sys.executable,
                str(harness),
            ],
            env=env,
            text=True,
            capture_output=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    return data, done


def _report(data, fmt):
    done = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "report", "--data", str(data), "--study", "t", "--format", fmt],
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cells_hold_the_per_episode_means_rej_and_too_few(recorded):
    data, _ = recorded
    doc = json.loads(_report(data, "json"))
    cells = {(c["stack"], c["model"], c["condition"]): c for c in doc["cells"]}
    assert len(cells) == 8
    ok = cells["jinja", "m-ok", "native"]
    # 6 episodes each due a call: 4 delivered a valid one, Oslo's and Rome's calls broke the schema
    assert ok["delivered_fidelity"]["episodes"] == 6 and ok["runs"] == ["t-jinja-m-ok-native"]
    assert ok["delivered_fidelity"]["episode_mean"] == pytest.approx(4 / 6)
    assert ok["delivered_fidelity"]["ci_low"] is not None and ok["delivered_fidelity"]["interval_note"] is None
    assert ok["call_fidelity"]["episode_mean"] == pytest.approx(4 / 6)
    # m-few answered four items in prose with no tool result and no expect tag: those episodes are
    # `open`, not scored, which leaves two: a mean, and no interval
    few = cells["jinja", "m-few", "native"]
    assert few["delivered_fidelity"]["episodes"] == 2 and few["delivered_fidelity"]["episode_mean"] == 1.0
    assert (
        few["delivered_fidelity"]["ci_low"] is None and few["delivered_fidelity"]["interval_note"] == "too few episodes"
    )
    # The cell's headline is the pooled call fidelity every view prints; a per-episode mean only
    # with enough episodes, labelled as one.
    assert few["text"] == "call 100% [34-100] (2/2); delivered 100% [34-100] (2/2)"
    assert ok["text"].startswith("call 67% [30-90] (4/6); delivered 67% [30-90] (4/6); per-episode mean 67% [")
    assert ok["text"].endswith("] over 6 episodes")
    refused = cells["nojinja", "m-ok", "native"]
    assert refused["rejected"] and refused["delivered_fidelity"]["episode_mean"] is None
    assert "tools param requires --jinja flag" in refused["cause"] and refused["text"].startswith("rej (refused")
    text = cells["nojinja", "m-ok", "text"]  # the text condition sends no tools: the same launch now delivers
    assert not text["rejected"] and text["delivered_fidelity"]["episode_mean"] == pytest.approx(4 / 6)


def test_paired_tests_pair_the_same_items_holm_within_each_family(recorded):
    data, _ = recorded
    tests = json.loads(_report(data, "json"))["tests"]
    families = {t["family"] for t in tests}
    assert families == {"conditions within a stack and model", "stacks within a model and condition"}
    refusal = next(t for t in tests if t["within"] == "nojinja, m-ok")  # native (rej) against text
    assert (refusal["a"], refusal["b"], refusal["paired"], refusal["a_only"], refusal["b_only"]) == (
        "native",
        "text",
        6,
        0,
        4,
    )
    assert refusal["p"] == pytest.approx(0.125) and refusal["p_holm"] >= refusal["p"]
    stacks = next(t for t in tests if t["within"] == "m-ok, native")
    assert (stacks["a"], stacks["b"], stacks["a_only"], stacks["b_only"]) == ("jinja", "nojinja", 4, 0)


def test_markdown_and_the_heat_map_show_the_same_cells(recorded):
    data, done = recorded
    md = _report(data, "markdown")
    assert "## Models x conditions, stack jinja" in md and "## Stacks x models, condition text" in md
    assert "| m-ok | call 67% [30-90] (4/6); delivered 67% [30-90] (4/6); per-episode mean 67% [" in md
    assert "| nojinja | rej (refused" in md and "| m-few | call 100% [34-100] (2/2); delivered" in md
    assert "too few" not in md and "(as sent)" not in md
    assert md in done.stdout  # the study prints its tables at the end
    html = _report(data, "html")
    assert html.count('<td class="rej"') == 4  # nojinja x two models under native, in both tables
    assert "rgb(" in html and "<caption>Stacks x models, condition native</caption>" in html
    assert "<b>call 100% [34-100] (2/2)</b><small>delivered 100% [34-100] (2/2)</small></td>" in html  # m-few
    assert html.count("<small>per-episode mean") == 6  # m-ok's 3 served cells, in both tables
    assert (data / "studies" / "t-tables.html").read_text() == html


def test_provenance_says_whose_parser_made_the_calls(recorded):
    data, _ = recorded
    origins = {p["run"]: p for p in json.loads(_report(data, "json"))["provenance"]}
    text = origins["t-nojinja-m-ok-text"]
    assert text["tool_parser"] == "toolproxy's, under the text condition (the stack saw no tools)"
    assert "calls parsed and delivered by toolproxy's text condition, not by the stack" in text["why"]
    # llama-server serves the one file it loaded, whatever model name the study sent
    assert text["served_model"] == "qwen2.5-7b-instruct-q4_k_m.gguf" and text["requested_model"] == "m-ok"
    assert text["served_differs"] and text["why"].startswith("the stack served qwen2.5-7b-instruct-q4_k_m.gguf, not")
    assert origins["t-jinja-m-ok-native"]["tool_parser"] == "active (calls arrived as tool_calls)"
    assert origins["t-nojinja-m-ok-native"]["why"].startswith("every turn refused")


def test_the_plain_report_shows_provenance_when_asked(recorded):
    data, _ = recorded
    cli = [
        sys.executable,
        "-m",
        "toolproxy.cli",
        "report",
        "--data",
        str(data),
        "--run",
        "t-nojinja-m-ok-native",
        "--provenance",
    ]
    done = subprocess.run([*cli, "--format", "markdown"], text=True, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("## Provenance\n\n")[1].startswith("- **t-nojinja-m-ok-native**: served ")
    assert "  Why this number: every turn refused" in done.stdout
    as_json = subprocess.run([*cli, "--format", "json"], text=True, capture_output=True, timeout=120)
    assert as_json.returncode == 0, as_json.stderr
    (run,) = json.loads(as_json.stdout)["runs"]
    assert run["provenance"]["run"] == run["run"] and run["provenance"]["why"].startswith("every turn refused")
    assert run["provenance"]["requested_model"] == "m-ok" and run["provenance"]["stack"] == "llamacpp"
    html = subprocess.run([*cli, "--format", "html"], text=True, capture_output=True, timeout=120)
    assert html.returncode == 0, html.stderr
    section = html.stdout.split("<h2>Provenance</h2>")[1]
    assert '<strong>t-nojinja-m-ok-native</strong>: <span class="why">every turn refused' in section
    assert "; requested m-ok; " in section and "stack llama.cpp" in section
    refused = subprocess.run([*cli, "--format", "csv"], text=True, capture_output=True, timeout=120)
    assert refused.returncode == 2 and "--provenance goes with" in refused.stderr and "Traceback" not in refused.stderr
