"""The /_toolproxy/ live page: a real `toolproxy serve` with --auth-token in front of an emulated
llama.cpp, real HTTP clients, and its counts checked against /_toolproxy/stats and `analyze`."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from html.parser import HTMLParser
from pathlib import Path

import pytest
from proxyprocess import LISTENING, ProxyProcess

from toolproxy import emulators as fakes
from toolproxy.analysis.report.screenshot import find_browser, run_chromium, screenshot
from toolproxy.live.classify import outcome_key
from toolproxy.live.tally import Tally, merge_reports
from toolproxy.live.view import LiveView
from toolproxy.record.model import Record, encode_record

TOKEN = "s3cret-page-token"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
# What a model may write: HTML, a terminal's escape sequences, a direction override.
HOSTILE = "<img src=x onerror=\"document.title='pwned'\"><b>bold</b> \x1b[31mred\x1b[0m\x07 \u202eevil"


def visible(text: str) -> str:
    """What the page shows for text (setText in toolproxy/live/page.html): control characters as \\xNN and
    direction overrides as [U+NNNN], each marked."""
    out = []
    for ch in text:
        o = ord(ch)
        if (o < 0x20 and ch not in "\t\n") or 0x7F <= o <= 0x9F:
            out.append(f"\\x{o:02x}")
        elif o in (0x200E, 0x200F) or 0x202A <= o <= 0x202E or 0x2066 <= o <= 0x2069:
            out.append(f"[U+{o:04X}]")
        else:
            out.append(ch)
    return "".join(out)


# What the scripted model does per prompt, and how many times each is sent per run.
SCRIPT = {
    "weather": (fakes.call("get_weather", {"city": "Paris"}), 3),
    "invent": (fakes.call("book_flight", {"to": "Rome"}), 2),
    "chat": (fakes.text(HOSTILE), 2),
    "in-text": (fakes.text_call("hermes", "get_weather", {"city": "Oslo"}), 1),
    "oom": (fakes.error(500, "out of memory"), 1),
}
RUNS = ("alpha", "beta")


def responder(req: fakes.ModelRequest) -> fakes.ScriptedReply:
    return SCRIPT[req.messages[-1]["content"]][0]


def send(url: str, path: str, body: dict | None = None, headers: dict | None = None, method: str | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def admin(url: str, path: str) -> dict:
    status, _, body = send(url, path, headers={"X-Toolproxy-Token": TOKEN})
    assert status == 200, body
    return json.loads(body)


def wait_classified(url: str, n: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        live = admin(url, "/_toolproxy/live?limit=1000")
        if live["classified"] >= n or time.monotonic() > deadline:
            return live
        time.sleep(0.05)


@pytest.fixture(scope="module")
def live_proxy(tmp_path_factory):
    """One proxy with traffic from two runs, every outcome the script makes, already classified."""
    data = tmp_path_factory.mktemp("live")
    with ExitStack() as stack:
        fake = fakes.FakeStack("llamacpp", responder=responder)
        stack.enter_context(fake.in_thread())
        p = ProxyProcess(fake.url, data, ("--auth-token", TOKEN, "--quiet"))
        stack.callback(p.stop)
        total = 0
        for run in RUNS:
            for prompt, (_, times) in SCRIPT.items():
                for i in range(times):
                    status, _, _ = send(
                        p.url,
                        "/v1/chat/completions",
                        {"model": fake.model, "tools": TOOLS, "messages": [{"role": "user", "content": prompt}]},
                        {
                            "Authorization": f"Bearer {TOKEN}",
                            "X-Toolproxy-Run": run,
                            "X-Toolproxy-Episode": f"{prompt}-{i}",
                        },
                    )
                    total += 1
        live = wait_classified(p.url, total)
        assert live["classified"] == total, live
        yield p, total, data


def test_counts_match_stats(live_proxy):
    p, total, _ = live_proxy
    stats = admin(p.url, "/_toolproxy/stats")
    live = admin(p.url, "/_toolproxy/live?limit=1000")
    assert stats["exchanges"] == total == live["observed"] == live["classified"]
    assert live["unclassified"] == {} and live["pending"] == 0 and live["failures"] == 0 and live["broken"] is None
    assert live["problems"] == [] and live["workers"] == 1
    by_class: dict[str, int] = {}
    for run in live["runs"].values():
        for k, n in run["by_status_class"].items():
            by_class[k] = by_class.get(k, 0) + n
    assert by_class == stats["by_status_class"]
    assert set(live["runs"]) == set(RUNS)
    for run in RUNS:
        r = live["runs"][run]
        assert r["exchanges"] == sum(t for _, t in SCRIPT.values())
        assert r["outcomes"] == {
            "valid_call/native": 3,
            "hallucinated_call/native": 2,
            "prose": 2,
            "valid_call/text": 1,
            "non_response/http_5xx": 1,
        }, r["outcomes"]
        assert r["calls"] == 3 + 2 + 1


def test_counts_match_analyze(live_proxy):
    """The same records through `toolproxy analyze`: the stored per-exchange outcomes agree."""
    p, total, data = live_proxy
    live = admin(p.url, "/_toolproxy/live?limit=1000")
    r = subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", "analyze", "--data", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "analyze: reading" not in r.stderr  # piped: no progress line
    q = (
        "SELECT run, outcome, CASE WHEN outcome = 'non_response' THEN sub_kind ELSE surface END, count(*) "
        "FROM exchanges WHERE outcome IS NOT NULL GROUP BY ALL ORDER BY ALL"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "sql",
            "--data",
            str(data),
            "--format",
            "json",
            q,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    stored: dict[str, dict[str, int]] = {}
    for row in json.loads(r.stdout):
        run, outcome, detail, n = row.values()
        stored.setdefault(run, {})[f"{outcome}/{detail}" if detail else outcome] = n
    assert stored == {run: c["outcomes"] for run, c in live["runs"].items()}


def test_recent_filters_and_detail(live_proxy):
    p, total, _ = live_proxy
    live = admin(p.url, "/_toolproxy/live?limit=1000")
    assert len(live["recent"]) == total
    assert [x["started_at"] for x in live["recent"]] == sorted((x["started_at"] for x in live["recent"]), reverse=True)
    beta = admin(p.url, "/_toolproxy/live?run=beta&limit=1000")["recent"]
    assert len(beta) == total // 2 and {x["run"] for x in beta} == {"beta"}
    halluc = admin(p.url, "/_toolproxy/live?run=alpha&outcome=hallucinated_call&limit=1000")["recent"]
    assert len(halluc) == 2 and all(x["outcome"] == "hallucinated_call" and x["run"] == "alpha" for x in halluc)
    surfaced = admin(p.url, "/_toolproxy/live?outcome=valid_call/text")["recent"]
    assert len(surfaced) == 2 and {outcome_key(x) for x in surfaced} == {"valid_call/text"}

    prose = admin(p.url, "/_toolproxy/live?outcome=prose&limit=1")["recent"][0]
    d = admin(p.url, f"/_toolproxy/exchange/{prose['id']}")
    assert d["content"] == HOSTILE == json.loads(d["response_body"])["choices"][0]["message"]["content"]
    auth = [v for k, v in d["request_headers"] if k.lower() == "authorization"]
    assert auth and TOKEN not in json.dumps(d) and auth[0].startswith("redacted:")
    assert json.loads(d["request_body"])["messages"][0]["content"] == "chat"
    call = admin(p.url, f"/_toolproxy/exchange/{halluc[0]['id']}")
    assert call["calls"] == [{"name": "book_flight", "arguments": '{"to":"Rome"}', "surface": "native", "valid": False}]
    status, _, body = send(p.url, "/_toolproxy/exchange/nope", headers={"X-Toolproxy-Token": TOKEN})
    assert status == 404 and "toolproxy show" in json.loads(body)["error"]["message"]


def test_token_gate_and_cookie(live_proxy):
    p, _, _ = live_proxy
    status, _, body = send(p.url, "/_toolproxy/live")
    assert status == 401 and "token" in json.loads(body)["error"]["message"]
    status, headers, body = send(p.url, "/_toolproxy/", headers={"Accept": "text/html"})
    assert status == 401 and b"<form method=post" in body and b"toolproxy_page" not in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    # The form posts the token in the body: a wrong one is refused, the right one gets a cookie.
    form = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "text/html"}
    req = urllib.request.Request(p.url + "/_toolproxy/login", data=b"token=wrong", headers=form)
    with pytest.raises(urllib.error.HTTPError) as wrong:
        urllib.request.urlopen(req, timeout=10)
    assert wrong.value.code == 401 and b"not this proxy" in wrong.value.read()

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(p.url + "/_toolproxy/login", data=f"token={TOKEN}".encode(), headers=form)
    with pytest.raises(urllib.error.HTTPError) as ok:
        opener.open(req, timeout=10)
    assert ok.value.code == 303 and ok.value.headers["Location"] == "/_toolproxy/"
    cookie = ok.value.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/_toolproxy/" in cookie
    assert TOKEN not in cookie
    jar = cookie.split(";")[0]
    status, headers, body = send(p.url, "/_toolproxy/", headers={"Accept": "text/html", "Cookie": jar})
    assert status == 200 and b"toolproxy live" in body
    nonce = headers["Content-Security-Policy"].split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">'.encode() in body and b"innerHTML" not in body
    status, _, body = send(p.url, "/_toolproxy/live", headers={"Cookie": jar})
    assert status == 200 and json.loads(body)["classified"] > 0
    # The cookie opens the admin routes only: it is not a way past the token for the model API.
    status, _, _ = send(p.url, "/v1/chat/completions", {"model": "m", "messages": []}, {"Cookie": jar})
    assert status == 401
    # JSON clients of /_toolproxy/ still get the counters.
    assert admin(p.url, "/_toolproxy/")["exchanges"] > 0


def test_no_live_page(tmp_path):
    """--no-live-page: no page, no classifier; the JSON counters stay where they were."""
    with ExitStack() as stack:
        fake = fakes.FakeStack("llamacpp")
        stack.enter_context(fake.in_thread())
        p = ProxyProcess(fake.url, tmp_path / "d", ("--no-live-page", "--quiet"))
        stack.callback(p.stop)
        status, _, body = send(p.url, "/_toolproxy/live")
        assert status == 404 and "no admin route" in json.loads(body)["error"]["message"]
        status, headers, body = send(p.url, "/_toolproxy/", headers={"Accept": "text/html"})
        assert status == 200 and json.loads(body)["exchanges"] == 0


def test_spilled_exchange_is_counted_not_classified(tmp_path):
    """A body over --spill-above never sits whole in memory, so the page counts that exchange
    (run, status) as `large` instead of classifying it; the others are classified as usual."""
    with ExitStack() as stack:
        fake = fakes.FakeStack("llamacpp", responder=responder)
        stack.enter_context(fake.in_thread())
        p = ProxyProcess(fake.url, tmp_path / "d", ("--spill-above", "1024", "--quiet", "--no-fingerprint"))
        stack.callback(p.stop)
        for content in ("weather", "chat"):
            messages = [
                {"role": "system", "content": "x" * (4096 if content == "chat" else 10)},
                {"role": "user", "content": content},
            ]
            status, _, _ = send(
                p.url,
                "/v1/chat/completions",
                {"model": fake.model, "tools": TOOLS, "messages": messages},
                {"X-Toolproxy-Run": "big"},
            )
            assert status == 200
        deadline = time.monotonic() + 60
        while (live := json.loads(send(p.url, "/_toolproxy/live")[2]))["pending"] or live["observed"] < 2:
            assert time.monotonic() < deadline, live
            time.sleep(0.05)
    run = live["runs"]["big"]
    assert live["classified"] == 1 and live["unclassified"] == {"large": 1}, live
    assert run["exchanges"] == 2 and run["by_status_class"] == {"2xx": 2} and run["unclassified"] == {"large": 1}
    assert run["outcomes"] == {"valid_call/native": 1}


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(") ", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
def test_the_classifier_is_one_light_process(live_proxy):
    """One child, the classifier module in a fresh interpreter: no multiprocessing resource tracker
    beside it, and neither the proxy's server, its event loop nor the spill cipher loaded in it
    (multiprocessing's spawn re-imported the proxy's whole main module there)."""
    p, total, _ = live_proxy
    children = _children(p.proc.pid)
    assert len(children) == 1, [Path(f"/proc/{c}/cmdline").read_bytes() for c in children]
    child = children[0]
    assert b"toolproxy.live.classifier" in Path(f"/proc/{child}/cmdline").read_bytes()
    loaded = Path(f"/proc/{child}/maps").read_text()
    assert "orjson" in loaded  # it did load what it uses
    for heavy in ("aiohttp", "uvloop", "cryptography", "duckdb", "re2"):
        assert f"/{heavy}" not in loaded, heavy


def test_ctrl_c_to_the_process_group_stops_quietly(tmp_path):
    """A terminal's Ctrl-C reaches the classifier process too: no traceback, a clean exit."""
    with ExitStack() as stack:
        fake = fakes.FakeStack("llamacpp")
        stack.enter_context(fake.in_thread())
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from toolproxy.cli import main; main()",
                "serve",
                "--upstream",
                fake.url,
                "--port",
                "0",
                "--data",
                str(tmp_path / "d"),
                "--quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        stack.callback(lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
        url = LISTENING.search(proc.stdout.readline()).group(1).rstrip(";,")
        send(url, "/v1/chat/completions", {"model": fake.model, "messages": [{"role": "user", "content": "hi"}]})
        deadline = time.monotonic() + 120
        while json.loads(send(url, "/_toolproxy/live")[2])["classified"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "Traceback" not in err, err


def _rec(i: int, run: str = "r", status: int = 200) -> Record:
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": f"hi {i}"}, "finish_reason": "stop"}]})
    return Record(
        id=f"id{i}",
        started_at=1000.0 + i,
        run=run,
        method="POST",
        path="/v1/chat/completions",
        status=status,
        request_body=json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        response_body=body,
        response_headers=[["Content-Type", "application/json"]],
        response_complete=True,
    )


def test_memory_is_bounded():
    """A full inbox lets the oldest go (counted, not classified); the recent ring and the run table keep their size."""
    view = LiveView(inbox=5, recent=4, max_runs=3)
    for i in range(12):  # the classifier is not started: everything waits in the inbox
        view.observe(_rec(i, run=f"run{i % 6}"))
    assert view.observed == 12 and len(view._inbox) == 5
    view.start()
    try:
        deadline = time.monotonic() + 30
        while (rep := view.report())["classified"] < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        first, gone = view.detail("id11"), view.detail("id7")
    finally:
        view.stop()
    assert rep["classified"] == 5 and rep["pending"] == 0 and rep["unclassified"] == {"behind": 7}, rep
    assert rep["observed"] == 12
    assert [x["id"] for x in rep["recent"]] == ["id11", "id10", "id9", "id8"]
    assert list(rep["runs"]) == ["run5", "run4", "run3"]  # the run quiet the longest was let go
    assert gone is None and first["content"] == "hi 11"
    assert rep["runs"]["run5"]["outcomes"] == {"prose": 1}
    assert view.report()["broken"] == "the classifier process is not running"


def test_the_turns_kept_are_bounded_and_a_run_that_outgrew_them_says_so():
    """At most so many attempts per run and in all; past that a run's oldest quarter goes and its
    figures say they are partial. Worked out again only when a run changed."""
    from toolproxy.live.classify import classify_record
    from toolproxy.live.tally import summarised
    from toolproxy.live.turns import LiveTurns

    turns = LiveTurns(per_run=8, total=12)
    for i in range(10):
        turns.add("a", classify_record(json.loads(encode_record(_rec(i, run="a"))))[2])
    a = turns.figures("a")
    assert (a["held"], a["let_go"], a["turns"]) == (8, 2, 8) and turns.figures("a") is a  # not worked out again
    for i in range(10, 18):
        turns.add("b", classify_record(json.loads(encode_record(_rec(i, run="b"))))[2])
    assert turns.held == sum(len(t.held) for t in turns.runs.values()) <= 12
    assert turns.figures("a") is not a and turns.figures("b")["held"] + turns.figures("a")["held"] == turns.held
    counts = {"causes": {}, "unclassified": {}, **turns.figures("a")}
    assert summarised("a", counts)["partial"] == (
        f"it outgrew what the page keeps: the figures cover its latest "
        f"{counts['held']} attempts ({counts['let_go']} earlier ones let go)"
    )
    assert summarised("a", {**counts, "let_go": 0, "held": 8})["partial"] is None
    turns.drop("a")
    assert turns.figures("a") is None and turns.held == len(turns.runs["b"].held)


def _classified(view: LiveView, n: int) -> dict:
    """Start the view, wait (at most 30 s) until it has classified n records, stop it: its report."""
    view.start()
    try:
        deadline = time.monotonic() + 30
        while (rep := view.report())["classified"] < n and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        view.stop()
    return rep


def test_the_inbox_is_bounded_in_bytes_too():
    """Long contexts waiting for a starved classifier hold at most inbox_bytes (and always the
    newest record); the ones let go are counted, and what is kept is classified."""
    view = LiveView(inbox=1000, inbox_bytes=250_000)

    def long(i: int, chars: int, run: str = "r") -> Record:
        rec = _rec(i, run=run)
        rec.request_body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * chars}]})
        return rec

    for i in range(10):
        rec = long(i, 100_000)
        view.observe(rec, encode_record(rec) if i % 2 else None)  # with its line, or the feeder encodes it
    assert len(view._inbox) == 2 and view._inbox_bytes <= 250_000
    huge = long(10, 400_000, run="huge")
    view.observe(huge, encode_record(huge))  # larger than the bound alone: kept, the rest go
    assert [entry[0][0] for entry in view._inbox] == ["huge"]
    rep = _classified(view, 1)
    assert rep["observed"] == 11 and rep["classified"] == 1 and rep["unclassified"] == {"behind": 10}, rep
    assert rep["pending"] == 0 and list(rep["runs"]["huge"]["outcomes"].values()) == [1]


def test_counted_when_behind_or_spilled():
    """Exchanges the classifier never sees still count, by run and status class, with the reason."""
    view = LiveView(inbox=2)
    for i in range(6):
        view.observe(_rec(i, run="busy", status=200 if i % 2 else 502))
    view.observe(_rec(9, run="big"), None, False)
    rep = _classified(view, 2)
    assert rep["observed"] == 7 and rep["classified"] == 2 and rep["pending"] == 0, rep
    assert rep["unclassified"] == {"behind": 4, "large": 1}
    busy, big = rep["runs"]["busy"], rep["runs"]["big"]
    assert busy["exchanges"] == 6 and busy["by_status_class"] == {"2xx": 3, "5xx": 3}
    assert busy["unclassified"] == {"behind": 4} and sum(busy["outcomes"].values()) == 2
    assert big == {**big, "exchanges": 1, "by_status_class": {"2xx": 1}, "unclassified": {"large": 1}, "outcomes": {}}
    assert busy["first"] == 1000.0 and busy["last"] == 1005.0


def test_a_run_tag_that_is_not_unicode_is_counted_under_its_stored_name():
    """A header's odd bytes arrive as surrogate escapes; an exchange counted without being
    classified (its body spilled) is sent to the classifier as JSON all the same, under the name
    its record line stores, and the feeder goes on (it died there, and every later exchange went
    unclassified)."""
    view = LiveView()
    view.observe(_rec(1, run="caf\udce9"), None, False)
    view.observe(_rec(2, run="plain"))
    rep = _classified(view, 1)
    assert rep["classified"] == 1 and rep["broken"] is None and rep["unclassified"] == {"large": 1}, rep
    assert rep["runs"]["caf\xe9"]["unclassified"] == {"large": 1}


MERGE_CASES = [
    # (worker reports' runs, merged runs)
    (
        [
            {
                "a": {
                    "exchanges": 2,
                    "first": 5.0,
                    "last": 9.0,
                    "calls": 1,
                    "by_status_class": {"2xx": 2},
                    "errors": {},
                    "outcomes": {"prose": 2},
                    "unclassified": {},
                    "models": {"m": 2},
                }
            },
            {
                "a": {
                    "exchanges": 3,
                    "first": 4.0,
                    "last": 7.0,
                    "calls": 2,
                    "by_status_class": {"2xx": 1, "5xx": 2},
                    "errors": {"upstream_5xx": 2},
                    "outcomes": {"prose": 1},
                    "unclassified": {"behind": 2},
                    "models": {"m": 1},
                },
                "b": {
                    "exchanges": 1,
                    "first": 10.0,
                    "last": 10.0,
                    "calls": 0,
                    "by_status_class": {"none": 1},
                    "errors": {"connect": 1},
                    "outcomes": {},
                    "unclassified": {},
                    "models": {},
                },
            },
        ],
        {
            "b": {
                "exchanges": 1,
                "first": 10.0,
                "last": 10.0,
                "calls": 0,
                "by_status_class": {"none": 1},
                "errors": {"connect": 1},
                "outcomes": {},
                "unclassified": {},
                "models": {},
            },
            "a": {
                "exchanges": 5,
                "first": 4.0,
                "last": 9.0,
                "calls": 3,
                "by_status_class": {"2xx": 3, "5xx": 2},
                "errors": {"upstream_5xx": 2},
                "outcomes": {"prose": 3},
                "unclassified": {"behind": 2},
                "models": {"m": 3},
            },
        },
    ),
    ([{}, {}], {}),
]


@pytest.mark.parametrize("runs, merged", MERGE_CASES)
def test_merge_reports(runs, merged):
    reports = []
    for i, r in enumerate(runs):
        rep = Tally().report(None, None, 0)
        rep.update(
            observed=10 * (i + 1),
            classified=i + 1,
            runs=r,
            unclassified={"behind": i},
            recent=[{"id": f"w{i}-{k}", "started_at": float(k * len(runs) + i)} for k in range(3)],
        )
        reports.append(rep)
    out = merge_reports(reports, 4)
    assert out["runs"] == merged and list(out["runs"]) == list(merged)
    assert out["observed"] == sum(10 * (i + 1) for i in range(len(runs)))
    assert out["classified"] == sum(i + 1 for i in range(len(runs)))
    assert out["unclassified"] == {"behind": sum(range(len(runs)))}
    starts = [x["started_at"] for x in out["recent"]]
    assert starts == sorted(starts, reverse=True) and len(starts) == 4 and starts[0] == 3 * len(runs) - 1


def test_a_record_the_analyzer_rejects_is_counted_not_fatal():
    tally = Tally()
    bad = json.loads(encode_record(_rec(1)))
    bad["response_body_encoding"] = "rot13"
    tally.add(b"{not json")
    tally.add(json.dumps(bad).encode())
    tally.add(encode_record(_rec(2)))
    rep = tally.report(None, None, 10)
    assert rep["classified"] + rep["failures"] == 3 and rep["failures"] >= 1 and tally.answer(("detail", "id2"))


class _Cells(HTMLParser):
    """Text of every cell of the rows of one table (by id), as the browser left the DOM."""

    def __init__(self, table: str) -> None:
        super().__init__()
        self.table, self.inside, self.rows, self.cell = table, False, [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.inside = dict(attrs).get("id") == self.table
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def _cells(dom: str, table: str) -> list[list[str]]:
    parser = _Cells(table)
    parser.feed(dom)
    return parser.rows


class _Text(HTMLParser):
    """The text of one element (by id), nested elements included, and the classes inside it."""

    def __init__(self, element_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.id, self.depth, self.text, self.classes = element_id, 0, "", []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self.depth:
            self.depth += 1
            self.classes.append(attrs.get("class"))
        elif attrs.get("id") == self.id:
            self.depth = 1

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.text += data


def _text_of(dom: str, element_id: str) -> str:
    return _element(dom, element_id).text


def _element(dom: str, element_id: str) -> _Text:
    parser = _Text(element_id)
    parser.feed(dom)
    assert f'id="{element_id}"' in dom, element_id
    return parser


def _shown_outcomes(cell: str) -> dict[str, int]:
    """The run row's "outcome/surface n (p%) · ..." cell, as counts."""
    return {k: int(n) for k, n in re.findall(r"(\S+) (\d+) \(\d+%\)", cell)}


@pytest.mark.skipif(find_browser() is None, reason="Chromium not installed (apt-get install -y chromium)")
def test_page_in_headless_chromium(live_proxy, tmp_path):
    """Chromium opens the page (token once, then the cookie) while traffic flows; traffic stopped,
    the numbers it shows are those of /_toolproxy/stats and, after `analyze`, of the report.
    Screenshots go to $TOOLPROXY_SCREENS when set (to look at), else to a temporary directory."""
    p, _, data = live_proxy
    screens = Path(os.environ.get("TOOLPROXY_SCREENS") or tmp_path)
    screens.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def traffic() -> None:
        prompts = list(SCRIPT)
        i = 0
        while not stop.is_set():  # every exchange its own episode: one turn each, as on the page
            send(
                p.url,
                "/v1/chat/completions",
                {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]},
                {"X-Toolproxy-Token": TOKEN, "X-Toolproxy-Run": "gamma", "X-Toolproxy-Episode": f"g{i}"},
            )
            i += 1
            stop.wait(0.01)

    page = f"{p.url}/_toolproxy/login?token={TOKEN}"
    flowing = threading.Thread(target=traffic, daemon=True)
    flowing.start()
    try:
        shot = screenshot(page, screens / "live-overview.png", 1400, 1000, wait_ms=5000)
    finally:
        stop.set()
        flowing.join(30)
    data_png = shot.read_bytes()
    assert data_png[:8] == b"\x89PNG\r\n\x1a\n" and len(data_png) > 40_000, len(data_png)

    total = admin(p.url, "/_toolproxy/stats")["exchanges"]
    assert wait_classified(p.url, total)["classified"] == total
    stats = admin(p.url, "/_toolproxy/stats")
    live = admin(p.url, "/_toolproxy/live?limit=1000")
    assert stats["exchanges"] == total and live["runs"]["gamma"]["exchanges"] > 0
    proc = run_chromium(page, "--dump-dom", "--virtual-time-budget=5000", "--window-size=1400,1000")
    dom = proc.stdout
    assert 'data-ready="1"' in dom, proc.stderr[-2000:]
    assert _text_of(dom, "exchanges") == f"{stats['exchanges']:,}"
    assert _text_of(dom, "health") == stats["status"]
    assert _text_of(dom, "classified") == f"{total:,}"
    # the upstream answered the start fingerprint and every exchange since: reachable, since the start
    assert _text_of(dom, "upstate") == "reachable" and stats["upstream_health"]["reachable"] is True
    assert re.fullmatch(
        r"since \d{1,2}:\d{2}:\d{2}( [AP]M)? · checked \d+[smhd].* ago \((fingerprint|probe)\)", _text_of(dom, "upwhy")
    ), _text_of(dom, "upwhy")
    rows = {r[0]: r for r in _cells(dom, "runs")[1:]}
    assert set(rows) == set(live["runs"])
    for run, counts in live["runs"].items():
        row = rows[run]
        shown = [int(x.replace(",", "")) for x in row[1:9]]
        assert shown == [
            counts["exchanges"],
            *(counts["by_status_class"].get(c, 0) for c in ("2xx", "4xx", "5xx", "none", "side")),
            counts["episodes"],
            counts["turns"],
        ]
        assert _shown_outcomes(row[13]) == counts["turn_outcomes"]
        assert int(row[14].replace(",", "")) == counts["calls"]
        h = counts["headline"]
        if h["verdict"]:  # every turn a non-response: rej and its cause, never a rate
            assert (row[10], row[11], row[12]) == ("rej", h["cause"], "rej")
        else:
            assert (row[10], row[11], row[12]) == (
                h["call"],
                h["delivered"] + (f" · {h['lost']} lost in text" if h["lost"] else ""),
                h["answered"],
            )
    assert sum(int(r[1].replace(",", "")) for r in rows.values()) == stats["exchanges"]

    # `analyze`, then its report: per run, the episodes, turns and outcomes the page showed,
    # non-responses by kind, the calls, and the call, delivered and answer figures.
    cli = [sys.executable, "-c", "from toolproxy.cli import main; main()"]
    r = subprocess.run([*cli, "analyze", "--data", str(data)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        [*cli, "report", "--data", str(data), "--format", "json"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    report = {run["run"]: run for run in json.loads(r.stdout)["runs"]}
    assert set(report) == set(rows)
    for run, row in rows.items():
        shown = _shown_outcomes(row[13])
        by_outcome: dict[str, int] = {}
        for key, n in shown.items():
            by_outcome[key.split("/")[0]] = by_outcome.get(key.split("/")[0], 0) + n
        rep = report[run]
        assert by_outcome == {k: n for k, n in rep["outcomes"].items() if n}, (run, shown, rep["outcomes"])
        assert sum(shown.values()) == rep["turns"] == int(row[8].replace(",", ""))
        assert rep["episodes"] == int(row[7].replace(",", ""))
        assert {k.split("/")[1]: n for k, n in shown.items() if k.startswith("non_response/")} == rep[
            "non_response_kinds"
        ]
        assert int(row[14].replace(",", "")) == rep["calls"]
        if rep["rejected"]:
            assert row[10] == row[12] == "rej"
            continue
        for cell, metric in ((row[10], "call_fidelity"), (row[11], "delivered_fidelity"), (row[12], "answer_rate")):
            assert f"({rep[metric]['numerator']}/{rep[metric]['denominator']})" in cell, (run, cell, rep[metric])

    # Filtered to one run and outcome, as a link to it would open it.
    shot = screenshot(
        f"{page}#run=beta&outcome=hallucinated_call", screens / "live-filtered.png", 1400, 1000, wait_ms=5000
    )
    assert shot.stat().st_size > 40_000
    proc = run_chromium(f"{page}#run=beta&outcome=hallucinated_call", "--dump-dom", "--virtual-time-budget=5000")
    listed = _cells(proc.stdout, "recent")[1:]
    assert len(listed) == 2 and all(r[1] == "beta" and r[5] == "hallucinated_call/native" for r in listed), listed

    # Opened on one exchange: the model's hostile text is inert text, its control characters visible.
    prose = admin(p.url, "/_toolproxy/live?outcome=prose&limit=1")["recent"][0]["id"]
    shot = screenshot(f"{page}#exchange={prose}", screens / "live-exchange.png", 1400, 1400, wait_ms=5000)
    assert shot.stat().st_size > 40_000
    proc = run_chromium(f"{page}#exchange={prose}", "--dump-dom", "--virtual-time-budget=5000")
    content = _element(proc.stdout, "d-content")
    assert content.text == visible(HOSTILE) and content.classes == ["ctl"] * 4, (content.text, content.classes)
    assert "\x1b" not in proc.stdout and "\u202e" not in proc.stdout
    assert "<img" not in proc.stdout and "<b>bold" not in proc.stdout and "pwned</title>" not in proc.stdout


@pytest.mark.skipif(find_browser() is None, reason="Chromium not installed (apt-get install -y chromium)")
def test_page_says_when_the_upstream_cannot_be_reached(tmp_path):
    """Nothing listens at the upstream's port: the page says so in words, and since when, while
    the proxy's own health (recording) stays ok."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = ProxyProcess(
        f"http://127.0.0.1:{port}", tmp_path / "data", ("--auth-token", TOKEN, "--quiet", "--no-fingerprint")
    )
    try:
        proc = run_chromium(f"{p.url}/_toolproxy/login?token={TOKEN}", "--dump-dom", "--virtual-time-budget=5000")
        up = admin(p.url, "/_toolproxy/stats")["upstream_health"]
    finally:
        p.stop()
    dom = proc.stdout
    assert 'data-ready="1"' in dom, proc.stderr[-2000:]
    assert _text_of(dom, "health") == "ok" and _text_of(dom, "upstate") == "unreachable"
    why = _text_of(dom, "upwhy")
    assert up["reachable"] is False and up["since"] is not None
    assert re.fullmatch(
        re.escape(
            f"cannot reach http://127.0.0.1:{port}: nothing is listening at 127.0.0.1:{port} (connection refused)."
        )
        + r" .+ · since \d{1,2}:\d{2}:\d{2}( [AP]M)? · checked \d+s ago \(probe\)",
        why,
    ), why
    assert why.startswith(up["error"] + " · ")


def test_workers_page_merges_every_worker(tmp_path):
    """`serve --workers 2`: whichever worker answers, the page's data holds both workers' exchanges,
    its counts are /_toolproxy/stats' totals and what was sent, and any recent exchange opens."""
    from concurrent.futures import ThreadPoolExecutor

    with ExitStack() as stack:
        fake = fakes.FakeStack("llamacpp", responder=responder)
        stack.enter_context(fake.in_thread())
        p = ProxyProcess(
            fake.url, tmp_path / "d", ("--workers", "2", "--auth-token", TOKEN, "--quiet", "--no-fingerprint")
        )
        stack.callback(p.stop)
        jobs = [(run, prompt) for run in RUNS for prompt, (_, times) in SCRIPT.items() for _ in range(times * 3)]

        def one(job) -> int:  # one connection each: the kernel spreads them over the workers
            run, prompt = job
            return send(
                p.url,
                "/v1/chat/completions",
                {"model": fake.model, "tools": TOOLS, "messages": [{"role": "user", "content": prompt}]},
                {"X-Toolproxy-Token": TOKEN, "X-Toolproxy-Run": run},
            )[0]

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(one, jobs))
        sent = len(jobs)
        assert statuses.count(200) == sent - 6 and statuses.count(500) == 6  # the script's "oom" turns
        deadline = time.monotonic() + 60  # the classifier runs on idle CPU time only: slow on a busy machine
        while True:
            stats = admin(p.url, "/_toolproxy/stats")
            live = admin(p.url, "/_toolproxy/live?limit=1000")
            if (stats["exchanges"] == sent and live["classified"] == sent) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert all(w["exchanges"] > 0 for w in stats["workers"]["per_worker"]), stats["workers"]
        for _ in range(6):  # several asks, so both workers answer some: each merges its peer's share
            live = admin(p.url, "/_toolproxy/live?limit=1000")
            assert live["workers"] == 2 and live["problems"] == [], live["problems"]
            assert live["observed"] == live["classified"] == stats["exchanges"] == sent and live["pending"] == 0
            assert sum(r["exchanges"] for r in live["runs"].values()) == sent
            by_class: dict[str, int] = {}
            for r in live["runs"].values():
                for k, n in r["by_status_class"].items():
                    by_class[k] = by_class.get(k, 0) + n
            assert by_class == stats["by_status_class"]
            assert len(live["recent"]) == sent and len({x["id"] for x in live["recent"]}) == sent
        for run in RUNS:
            assert live["runs"][run]["outcomes"] == {
                "valid_call/native": 9,
                "hallucinated_call/native": 6,
                "prose": 6,
                "valid_call/text": 3,
                "non_response/http_5xx": 3,
            }
        beta = admin(p.url, "/_toolproxy/live?run=beta&outcome=prose&limit=1000")["recent"]
        assert len(beta) == 6 and {(x["run"], x["outcome"]) for x in beta} == {("beta", "prose")}
        for x in live["recent"][:12]:  # held by one worker or the other; asked of whichever answers
            d = admin(p.url, f"/_toolproxy/exchange/{x['id']}")
            assert d["id"] == x["id"] and d["request_headers"]


def _classifier_of(records_fd: int, queries_fd: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "toolproxy.live.classifier", str(records_fd), str(queries_fd), "", "10", "10"],
        pass_fds=(records_fd, queries_fd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_worker_killed_mid_hand_off_leaves_a_quiet_classifier():
    """A worker SIGKILLed while it sends a batch leaves half a message in the pipe: the classifier
    reads to the cut (multiprocessing says "got end of file during message", an OSError, not EOF)
    and ends without a traceback."""
    import multiprocessing
    import struct

    rec_out, rec_in = multiprocessing.Pipe(duplex=False)
    queries, child_queries = multiprocessing.Pipe()
    proc = _classifier_of(rec_out.fileno(), child_queries.fileno())
    rec_out.close()
    child_queries.close()
    os.write(rec_in.fileno(), struct.pack("!i", 1 << 20) + b'[0, [], []]\n{"id": "cut here')  # a message cut short
    rec_in.close()
    out, err = proc.communicate(timeout=60)  # the query pipe stays open: only the records pipe was cut
    queries.close()
    assert proc.returncode == 0 and err == "", err


def test_a_worker_gone_before_its_answer_leaves_a_quiet_classifier():
    """The page asked, then the worker died: sending the answer hits a closed pipe (BrokenPipeError)."""
    import multiprocessing

    rec_out, rec_in = multiprocessing.Pipe(duplex=False)
    queries, child_queries = multiprocessing.Pipe()
    proc = _classifier_of(rec_out.fileno(), child_queries.fileno())
    rec_out.close()
    child_queries.close()
    queries.send((1, ["report", None, None, 10]))
    queries.close()  # gone before the answer: the classifier's send hits a closed pipe
    out, err = proc.communicate(timeout=60)
    rec_in.close()
    assert proc.returncode == 0 and err == "", err


def test_stopping_does_not_wait_for_the_classifier_s_backlog():
    """The classifier runs on idle CPU only; a proxy stopping must not wait for it to finish a
    backlog nobody will see (with no serve lines to print): it is terminated at once. Waiting for
    it made `serve --workers 2` overrun a 10 s stop on a busy machine."""
    content = ('{"name": "f", "arguments": {"a": [' + "1," * 20000 + "1]}} ") * 5  # ~0.2 s of CPU each
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]})
    view = LiveView(log=None)
    view.start()
    for i in range(8):  # about as much as the inbox holds (1 MB): a second or two of classifying on idle CPU
        rec = dataclasses.replace(_rec(i), response_body=body)
        view.observe(rec, encode_record(rec))
    deadline = time.monotonic() + 30
    while view._inbox and time.monotonic() < deadline:  # taken by the feeder: the classifier has its backlog
        time.sleep(0.05)
    assert not view._inbox
    started = time.monotonic()
    view.stop(timeout=30)
    took = time.monotonic() - started
    assert view._proc.returncode == -signal.SIGTERM, view._proc.returncode  # terminated, not finished
    assert took < 10, took
