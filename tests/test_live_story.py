"""The live page, serve's line per exchange and `toolproxy run`'s summary tell the report's story.

Three recordings a reader must not misread, through a real `toolproxy serve` each (live page on, its
lines printed) and then `analyze` + `report` on the same data: a llama-server launched without
--jinja refuses every request with tools (the run is `rej`, with the stack's own words, never
n/a or 0%), and one whose model writes its call as a fenced JSON block in the text, which the
harness (examples/react_agent.py, reading tool_calls only) never gets as a call (the call is lost,
never drawn as the delivered green), and a harness that nudges after prose and resends a request
the stack failed (the page counts turns, episodes and roles as the report does, not exchanges).
The page's JSON, the page as Chromium renders it, the log lines and `toolproxy run`'s line are each
checked against the report's numbers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from proxyprocess import ProxyProcess, toolproxy_cli

from toolproxy import emulators as fakes
from toolproxy.analysis.measure.runline import exchange_text, from_report
from toolproxy.analysis.report.screenshot import find_browser, run_chromium

REPO = Path(__file__).resolve().parents[1]
REACT = REPO / "examples" / "react_agent.py"
FENCED = '```json\n{"name": "calculator", "arguments": {"expression": "(3 + 4) * 2"}}\n```'
JINJA = "tools param requires --jinja flag"


def _agent(url: str, run: str) -> subprocess.CompletedProcess:
    """Two episodes of react_agent (it resends a request once after a 5xx, as the openai SDK does)."""
    return subprocess.run(
        [sys.executable, str(REACT), "--proxy", url, "--model", "m", "--run", run, "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _live(p: ProxyProcess, n: int) -> dict:
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(p.url + "/_toolproxy/live?limit=100", timeout=10) as r:
            live = json.loads(r.read())
        if live["classified"] >= n or time.monotonic() > deadline:
            return live
        time.sleep(0.05)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Both stacks, each behind its own serve, recording into one data directory; the page's JSON
    and each proxy's printed lines, taken while they run."""
    data = tmp_path_factory.mktemp("story")
    refusing = fakes.FakeStack("no_jinja")
    in_text = fakes.FakeStack("llamacpp", responder=lambda req: fakes.text(FENCED))
    with refusing.in_thread(), in_text.in_thread():
        proxies = {"refused": ProxyProcess(refusing.url, data, ()), "in-text": ProxyProcess(in_text.url, data, ())}
        try:
            out = {}
            for run, p in proxies.items():
                agent = _agent(p.url, run)
                live = _live(p, 4 if run == "refused" else 2)
                out[run] = {"agent": agent, "live": live, "url": p.url, "page": _page(p.url)}
            time.sleep(0.3)  # the classifier prints its lines just after it counts them
            for run, p in proxies.items():
                out[run]["lines"] = p.output()
        finally:
            for p in proxies.values():
                p.stop()
    assert toolproxy_cli("analyze", "--data", str(data)).returncode == 0
    rep = toolproxy_cli("report", "--data", str(data), "--format", "json")
    assert rep.returncode == 0, rep.stderr
    report = {r["run"]: r for r in json.loads(rep.stdout)["runs"]}
    return out, report


def _page(url: str) -> str | None:
    if find_browser() is None:
        return None
    return run_chromium(
        url + "/_toolproxy/", "--dump-dom", "--virtual-time-budget=5000", "--window-size=1400,900"
    ).stdout


def test_the_harness_got_what_the_report_says(recorded):
    out, report = recorded
    assert (
        out["refused"]["agent"].returncode == 1
        and JINJA in out["refused"]["agent"].stdout + out["refused"]["agent"].stderr
    )
    # no call reached it: it says its "answer" was the call, left in text, and fails
    assert out["in-text"]["agent"].returncode == 1 and "tool call left in text" in out["in-text"]["agent"].stderr
    assert report["refused"]["rejected"] and report["refused"]["non_response_kinds"] == {"refused": 2}
    assert report["refused"]["non_response_causes"] == {"refused": JINJA}
    txt = report["in-text"]
    assert (txt["call_fidelity"]["numerator"], txt["call_fidelity"]["denominator"]) == (2, 2)
    assert (txt["delivered_fidelity"]["numerator"], txt["lost_in_serving"]) == (0, 1.0)


def test_the_live_json_says_what_the_report_says(recorded):
    out, report = recorded
    refused = out["refused"]["live"]["runs"]["refused"]
    want = from_report(report["refused"]).cells()
    # each refused turn was sent twice: 4 exchanges, and 2 turns on the page as in the report; both read rej
    assert refused["exchanges"] == 4 and refused["turns"] == report["refused"]["turns"] == 2
    assert refused["headline"] == want
    assert (
        refused["headline"]["verdict"] == "rej" and (want["call"], want["delivered"], want["answered"]) == ("rej",) * 3
    )
    assert want["cause"] == f"refused 2: {JINJA} (a serving failure)"
    assert [s["key"] for s in refused["bar"]] == ["nr-serving"]
    in_text = out["in-text"]["live"]["runs"]["in-text"]
    want = from_report(report["in-text"])
    assert in_text["headline"]["lost"] == want.lost == 2 and in_text["headline"]["verdict"] is None
    assert in_text["headline"]["delivered"] == "0% (0/2)" and "(0/2)" in want.cells()["delivered"]
    assert in_text["headline"]["call"] == "100% (2/2)" and "(2/2)" in want.cells()["call"]
    assert in_text["bar"] == [{"key": "lost", "label": "valid call left in text (lost in serving)", "n": 2}]
    assert all(x["delivered"] is False for x in out["in-text"]["live"]["recent"])
    assert "2 valid calls left in text, lost in serving" in in_text["line"] and "left in text" in want.text()


def test_serve_prints_each_exchange_with_its_outcome(recorded):
    out, _ = recorded
    refused = [line for line in out["refused"]["lines"].splitlines() if "POST /v1/chat/completions" in line]
    assert len(refused) == 4, out["refused"]["lines"]
    assert all(line.endswith(f"-> non_response/refused: {JINJA} (a serving failure)") for line in refused), refused
    in_text = [line for line in out["in-text"]["lines"].splitlines() if "POST /v1/chat/completions" in line]
    assert len(in_text) == 2 and all(
        re.search(
            r"^200 POST /v1/chat/completions run=in-text ep=\d+ item=task_\d+ \d+ms -> "
            r"valid_call/text: left in text, the harness got prose",
            line,
        )
        for line in in_text
    ), in_text


@pytest.mark.skipif(find_browser() is None, reason="Chromium not installed (apt-get install -y chromium)")
def test_the_rendered_page_draws_the_same(recorded):
    out, _ = recorded
    refused = out["refused"]["page"]
    assert 'data-ready="1"' in refused
    assert re.search(
        r'<td class="num rej">rej</td><td class="rej"[^>]*>refused 2: ' + re.escape(JINJA) + r"[^<]*</td>"
        r'<td class="num rej">rej</td>',
        refused,
    ), refused[-3000:]
    in_text = out["in-text"]["page"]
    assert '<span class="o-lost"' in in_text and '<span class="o-delivered"' not in in_text
    assert re.search(
        r'<td class="num">100% \(2/2\)</td><td class="num wrap lost">0% \(0/2\) · 2 lost in text</td>'
        r'<td class="num">0% \(0/2\)</td>',
        in_text,
    )


def test_toolproxy_run_summarises_a_refused_run_as_rej(tmp_path):
    with fakes.FakeStack("no_jinja").in_thread() as url:
        done = toolproxy_cli(
            "run",
            "--upstream",
            url,
            "--run",
            "r",
            "--data",
            str(tmp_path / "d"),
            "--no-fingerprint",
            "--",
            sys.executable,
            str(REACT),
            "--model",
            "m",
            "--episodes",
            "2",
        )
    assert done.returncode == 1
    assert "toolproxy run: the harness exited with code 1" in done.stderr
    assert (
        f"run r: 2 episodes, 2 turns: rej: every one a non-response, no rate is defined (refused 2: {JINJA} "
        "(a serving failure))" in done.stderr
    ), done.stderr
    assert "n/a" not in done.stderr


EXCHANGES = [
    ({"outcome": None}, "not a model turn"),
    ({"outcome": "valid_call", "surface": "native", "delivered": True}, "valid_call/native: delivered"),
    ({"outcome": "valid_call", "surface": "text", "delivered": True}, "valid_call/text: delivered"),
    (
        {"outcome": "valid_call", "surface": "text", "delivered": False},
        "valid_call/text: left in text, the harness got prose (lost unless it parses text itself)",
    ),
    ({"outcome": "hallucinated_call", "surface": "native", "delivered": None}, "hallucinated_call/native"),
    ({"outcome": "prose", "surface": None, "delivered": None}, "prose"),
    (
        {"outcome": "non_response", "sub_kind": "model_stopped", "detail": None},
        "non_response/model_stopped: the model ended its turn at once (its end token, no text) "
        "(the model's doing, not a serving failure)",
    ),
    (
        {
            "outcome": "non_response",
            "sub_kind": "stop_string",
            "detail": "a stop string the harness sent cut the reply: 'Observation:'",
        },
        "non_response/stop_string: a stop string the harness sent cut the reply: 'Observation:' "
        "(the harness's doing, not a serving failure)",
    ),
    (
        {"outcome": "non_response", "sub_kind": "http_5xx", "detail": "out of memory\n" + "x" * 300},
        "non_response/http_5xx: out of memory " + "x" * 103 + "... (a serving failure)",
    ),
]


@pytest.mark.parametrize("summary,text", EXCHANGES)
def test_exchange_text(summary, text):
    assert exchange_text(summary) == text


# A harness that nudges once when the model answers in prose before any tool ran, and resends a
# request once after a 5xx (as the openai SDK does); untagged, so the episodes are rebuilt.
NUDGING_HARNESS = r"""
import json, os, sys, time, urllib.error, urllib.request

BASE = os.environ.get("OPENAI_BASE_URL") or sys.argv[1]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def complete(messages):
    data = json.dumps({"model": "m", "messages": messages, "tools": TOOLS}).encode()
    for attempt in (1, 2):
        try:
            req = urllib.request.Request(BASE.rstrip("/") + "/chat/completions", data=data,
                                         headers={"Content-Type": "application/json", "Authorization": "Bearer k"})
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())["choices"][0]["message"]
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == 2:
                raise
            time.sleep(0.2)


for city in ("Oslo", "Rome"):
    messages = [{"role": "user", "content": f"Weather in {city}?"}]
    nudged = ran = False
    for _ in range(6):
        msg = complete(messages)
        calls = msg.get("tool_calls") or []
        reply = {"role": "assistant", "content": msg.get("content") or ""}
        messages.append({**reply, **({"tool_calls": calls} if calls else {})})
        if calls:
            for c in calls:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": "5C"})
            ran = True
        elif not ran and not nudged:
            messages.append({"role": "user", "content": "Please use the get_weather tool."})
            nudged = True
        else:
            print("answer:", msg.get("content"))
            break
"""


def _nudging_model():
    """Oslo: prose first (the harness nudges), then the call, then the answer. Rome: a 500 the
    first time its opening request comes, the call when it is sent again, then the answer."""
    seen: dict[str, int] = {}

    def respond(req: fakes.ModelRequest) -> fakes.ScriptedReply:
        roles = [m.get("role") for m in req.messages]
        task = req.messages[0]["content"]
        if "tool" in roles:
            return fakes.text("It is 5C.")
        if "Oslo" in task and len(req.messages) == 1:
            return fakes.text("Let me think about Oslo.")
        if "Rome" in task and len(req.messages) == 1:
            seen[task] = seen.get(task, 0) + 1
            if seen[task] == 1:
                return fakes.error(500, "the slot was busy")
        return fakes.call("get_weather", {"city": "Oslo" if "Oslo" in task else "Rome"})

    return respond


@pytest.fixture(scope="module")
def nudged(tmp_path_factory):
    """The nudging harness behind `toolproxy serve` (the page's JSON once every exchange is
    classified, then analyze and report) and behind `toolproxy run` (its line)."""
    root = tmp_path_factory.mktemp("nudge")
    script = root / "harness.py"
    script.write_text(NUDGING_HARNESS)
    with fakes.FakeStack("llamacpp", responder=_nudging_model()).in_thread() as url:
        p = ProxyProcess(url, root / "served", ("--no-fingerprint",))
        try:
            done = subprocess.run(
                [sys.executable, str(script), p.url + "/t/run=nudge/v1"], capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            live = _live(p, 6)["runs"]["nudge"]
        finally:
            p.stop()
    assert toolproxy_cli("analyze", "--data", str(root / "served")).returncode == 0
    rep = toolproxy_cli("report", "--data", str(root / "served"), "--format", "json")
    assert rep.returncode == 0, rep.stderr
    (report,) = json.loads(rep.stdout)["runs"]
    with fakes.FakeStack("llamacpp", responder=_nudging_model()).in_thread() as url:
        ran = toolproxy_cli(
            "run",
            "--upstream",
            url,
            "--run",
            "nudge",
            "--data",
            str(root / "run"),
            "--no-fingerprint",
            "--",
            sys.executable,
            str(script),
        )
    assert ran.returncode == 0, ran.stderr
    return live, report, ran.stderr


def test_a_nudge_and_a_retry_read_the_same_on_the_page_in_runs_line_and_in_the_report(nudged):
    live, report, run_output = nudged
    assert live["exchanges"] == 6  # 3 for Oslo; Rome's opening request twice, then the answer
    # the report: 2 episodes of 5 turns; Oslo's prose was a call the harness had to nudge for
    assert (report["episodes"], report["turns"]) == (2, 5)
    assert report["roles"]["call"] == 3 and report["roles"]["answer"] == 2
    for metric, want in (("call_fidelity", (2, 3)), ("delivered_fidelity", (2, 3)), ("answer_rate", (2, 2))):
        assert (report[metric]["numerator"], report[metric]["denominator"]) == want, metric
    assert report["non_response_kinds"] == {}  # the failed attempt was retried: its turn got the call
    # the page counts the same turns, episodes and roles
    assert (live["episodes"], live["turns"], live["roles"]) == (
        report["episodes"],
        report["turns"],
        {k: v for k, v in report["roles"].items() if v},
    )
    want = {k: _no_interval(v) for k, v in from_report(report).cells().items()}
    assert {k: live["headline"][k] for k in ("call", "delivered", "answered", "lost", "verdict", "non_responses")} == {
        k: want[k] for k in ("call", "delivered", "answered", "lost", "verdict", "non_responses")
    }
    assert "(2/3)" in live["headline"]["call"] and "(2/3)" in live["headline"]["delivered"]
    assert "(2/2)" in live["headline"]["answered"] and live["partial"] is None
    assert live["line"].startswith(
        "run nudge: 2 episodes, 5 turns (3 due a call); call fidelity 67% (2/3), "
        "delivered 67% (2/3); answered 100% (2/2)"
    ), live["line"]
    # and `toolproxy run`'s line, from its own recording of the same harness
    line = next(x for x in run_output.splitlines() if x.startswith("run nudge:"))
    assert _no_interval(line) == live["line"], (line, live["line"])


def _no_interval(value):
    """The report's figures without the confidence interval the page does not compute."""
    return re.sub(r" \[\d+-\d+\]", "", value) if isinstance(value, str) else value
