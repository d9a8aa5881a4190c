"""The live page, serve's line per exchange and `toolproxy run`'s summary tell the report's story.

Two recordings a reader must not misread, through a real `toolproxy serve` each (live page on, its
lines printed) and then `analyze` + `report` on the same data: a llama-server launched without
--jinja refuses every request with tools (the run is `rej`, with the stack's own words, never
n/a or 0%), and one whose model writes its call as a fenced JSON block in the text, which the
harness (examples/react_agent.py, reading tool_calls only) never gets as a call (the call is lost,
never drawn as the delivered green). The page's JSON, the page as Chromium renders it, the log
lines and `toolproxy run`'s line are each checked against the report's numbers.
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

from toolproxy.analysis.report.screenshot import find_browser, run_chromium
from toolproxy.analysis.runline import exchange_text, from_report
from toolproxy.testing import fakes

REPO = Path(__file__).resolve().parents[1]
REACT = REPO / "examples" / "react_agent.py"
FENCED = '```json\n{"name": "calculator", "arguments": {"expression": "(3 + 4) * 2"}}\n```'
JINJA = "tools param requires --jinja flag"


def _agent(url: str, run: str) -> subprocess.CompletedProcess:
    """Two episodes of react_agent (it resends a request once after a 5xx, as the openai SDK does)."""
    return subprocess.run([sys.executable, str(REACT), "--proxy", url, "--model", "m", "--run", run, "--episodes", "2"],
                          capture_output=True, text=True, timeout=60)


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
    return run_chromium(url + "/_toolproxy/", "--dump-dom", "--virtual-time-budget=5000", "--window-size=1400,900").stdout


def test_the_harness_got_what_the_report_says(recorded):
    out, report = recorded
    assert out["refused"]["agent"].returncode == 1 and JINJA in out["refused"]["agent"].stdout + out["refused"]["agent"].stderr
    assert out["in-text"]["agent"].returncode == 0  # it took the text for an answer: no call reached it
    assert report["refused"]["rejected"] and report["refused"]["non_response_kinds"] == {"refused": 2}
    assert report["refused"]["non_response_causes"] == {"refused": JINJA}
    txt = report["in-text"]
    assert (txt["call_fidelity"]["numerator"], txt["call_fidelity"]["denominator"]) == (2, 2)
    assert (txt["delivered_fidelity"]["numerator"], txt["lost_in_serving"]) == (0, 1.0)


def test_the_live_json_says_what_the_report_says(recorded):
    out, report = recorded
    refused = out["refused"]["live"]["runs"]["refused"]
    want = from_report(report["refused"]).cells()
    # the page counts exchanges (each refused turn was sent twice), the report turns; both read rej
    assert refused["headline"]["verdict"] == want["verdict"] == "rej"
    assert (refused["headline"]["call"], refused["headline"]["delivered"]) == (want["call"], want["delivered"]) == ("rej", "rej")
    assert refused["headline"]["cause"] == f"refused 4: {JINJA} (a serving failure)"
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
    assert len(in_text) == 2 and all(re.search(r"^200 POST /v1/chat/completions run=in-text ep=\d+ item=task_\d+ \d+ms -> "
                                               r"valid_call/text: left in text, the harness got prose", line)
                                     for line in in_text), in_text


@pytest.mark.skipif(find_browser() is None, reason="Chromium not installed (apt-get install -y chromium)")
def test_the_rendered_page_draws_the_same(recorded):
    out, _ = recorded
    refused = out["refused"]["page"]
    assert 'data-ready="1"' in refused
    assert re.search(r'<td class="num rej">rej</td><td class="rej"[^>]*>refused 4: ' + re.escape(JINJA), refused), refused[-3000:]
    in_text = out["in-text"]["page"]
    assert '<span class="o-lost"' in in_text and '<span class="o-delivered"' not in in_text
    assert re.search(r'<td class="num">100% \(2/2\)</td><td class="num lost">0% \(0/2\) · 2 lost in text</td>', in_text)


def test_toolproxy_run_summarises_a_refused_run_as_rej(tmp_path):
    with fakes.FakeStack("no_jinja").in_thread() as url:
        done = toolproxy_cli("run", "--upstream", url, "--run", "r", "--data", str(tmp_path / "d"), "--no-fingerprint",
                             "--", sys.executable, str(REACT), "--model", "m", "--episodes", "2")
    assert done.returncode == 1
    assert "toolproxy run: the harness exited with code 1" in done.stderr
    assert f"run r: 2 episodes, 2 turns: rej: every one a non-response, no rate is defined (refused 2: {JINJA} " \
           "(a serving failure))" in done.stderr, done.stderr
    assert "n/a" not in done.stderr


EXCHANGES = [
    ({"outcome": None}, "not a model turn"),
    ({"outcome": "valid_call", "surface": "native", "delivered": True}, "valid_call/native: delivered"),
    ({"outcome": "valid_call", "surface": "text", "delivered": True}, "valid_call/text: delivered"),
    ({"outcome": "valid_call", "surface": "text", "delivered": False},
     "valid_call/text: left in text, the harness got prose (lost unless it parses text itself)"),
    ({"outcome": "hallucinated_call", "surface": "native", "delivered": None}, "hallucinated_call/native"),
    ({"outcome": "prose", "surface": None, "delivered": None}, "prose"),
    ({"outcome": "non_response", "sub_kind": "model_stopped", "detail": None},
     "non_response/model_stopped: the model ended its turn at once (its end token, no text) "
     "(the model's doing, not a serving failure)"),
    ({"outcome": "non_response", "sub_kind": "stop_string", "detail": "a stop string the harness sent cut the reply: 'Observation:'"},
     "non_response/stop_string: a stop string the harness sent cut the reply: 'Observation:' "
     "(the harness's doing, not a serving failure)"),
    ({"outcome": "non_response", "sub_kind": "http_5xx", "detail": "out of memory\n" + "x" * 300},
     "non_response/http_5xx: out of memory " + "x" * 103 + "... (a serving failure)"),
]


@pytest.mark.parametrize("summary,text", EXCHANGES)
def test_exchange_text(summary, text):
    assert exchange_text(summary) == text
