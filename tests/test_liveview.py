"""The /_toolproxy/ live page: a real `toolproxy serve` with --auth-token in front of an emulated
llama.cpp, real HTTP clients, and its counts checked against /_toolproxy/stats and `analyze`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import ExitStack

import pytest
from conftest import ProxyProcess

from toolproxy.proxy.live import LiveView, outcome_key
from toolproxy.record.model import Record
from toolproxy.stacks import fakes

TOKEN = "s3cret-page-token"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><b>bold</b>'

# What the scripted model does per prompt, and how many times each is sent per run.
SCRIPT = {
    "weather": (fakes.call("get_weather", {"city": "Paris"}), 3),
    "invent": (fakes.call("book_flight", {"to": "Rome"}), 2),
    "chat": (fakes.text(HOSTILE), 2),
    "in-text": (fakes.text_call("hermes", "get_weather", {"city": "Oslo"}), 1),
    "oom": (fakes.error(500, "out of memory"), 1),
}
RUNS = ("alpha", "beta")


def responder(req: fakes.ModelRequest) -> fakes.Reply:
    return SCRIPT[req.messages[-1]["content"]][0]


def send(url: str, path: str, body: dict | None = None, headers: dict | None = None, method: str | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def admin(url: str, path: str) -> dict:
    status, _, body = send(url, path, headers={"X-Toolproxy-Token": TOKEN})
    assert status == 200, body
    return json.loads(body)


def wait_classified(url: str, n: int, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        live = admin(url, "/_toolproxy/live?limit=1000")
        if live["classified"] >= n or time.monotonic() > deadline:
            return live
        time.sleep(0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
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
                    status, _, _ = send(p.url, "/v1/chat/completions", {
                        "model": fake.model, "tools": TOOLS, "messages": [{"role": "user", "content": prompt}]},
                        {"Authorization": f"Bearer {TOKEN}", "X-Toolproxy-Run": run, "X-Toolproxy-Episode": f"{prompt}-{i}"})
                    total += 1
        live = wait_classified(p.url, total)
        assert live["classified"] == total, live
        yield p, total, data


def test_counts_match_stats(served):
    p, total, _ = served
    stats = admin(p.url, "/_toolproxy/stats")
    live = admin(p.url, "/_toolproxy/live?limit=1000")
    assert stats["exchanges"] == total == live["observed"] == live["classified"]
    assert live["skipped"] == 0 and live["pending"] == 0 and live["failures"] == 0
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
            "valid_call/native": 3, "hallucinated_call/native": 2, "prose": 2, "valid_call/text": 1,
            "non_response/http_5xx": 1,
        }, r["outcomes"]
        assert r["calls"] == 3 + 2 + 1


def test_counts_match_analyze(served):
    """The same records through `toolproxy analyze`: the stored per-exchange outcomes agree."""
    p, total, data = served
    live = admin(p.url, "/_toolproxy/live?limit=1000")
    r = subprocess.run([sys.executable, "-c", "from toolproxy.cli import main; main()", "analyze", "--data", str(data)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "analyze: reading" not in r.stderr  # piped: no progress line
    q = ("SELECT run, outcome, CASE WHEN outcome = 'non_response' THEN sub_kind ELSE surface END, count(*) "
         "FROM exchanges WHERE outcome IS NOT NULL GROUP BY ALL ORDER BY ALL")
    r = subprocess.run([sys.executable, "-c", "from toolproxy.cli import main; main()", "sql", "--data", str(data),
                        "--format", "json", q], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    stored: dict[str, dict[str, int]] = {}
    for row in json.loads(r.stdout):
        run, outcome, detail, n = row.values()
        stored.setdefault(run, {})[f"{outcome}/{detail}" if detail else outcome] = n
    assert stored == {run: c["outcomes"] for run, c in live["runs"].items()}


def test_recent_filters_and_detail(served):
    p, total, _ = served
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


def test_token_gate_and_cookie(served):
    p, _, _ = served
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


def _rec(i: int, run: str = "r", status: int = 200) -> Record:
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": f"hi {i}"}, "finish_reason": "stop"}]})
    return Record(id=f"id{i}", started_at=1000.0 + i, run=run, method="POST", path="/v1/chat/completions",
                  status=status, request_body=json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                  response_body=body, response_headers=[["Content-Type", "application/json"]], response_complete=True)


def test_memory_is_bounded():
    """A full inbox lets the oldest go (counted); the recent ring and the run table keep their size."""
    view = LiveView(inbox=5, recent=4, max_runs=3)
    for i in range(12):  # the classifier is not started: everything waits in the inbox
        view.observe(_rec(i, run=f"run{i % 6}"))
    assert view.report()["pending"] == 5 and view.skipped == 7 and view.observed == 12
    view.start()
    try:
        deadline = time.monotonic() + 10
        while view.classified < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        rep = view.report()
    finally:
        view.stop()
    assert rep["classified"] == 5 and [x["id"] for x in rep["recent"]] == ["id11", "id10", "id9", "id8"]
    assert list(rep["runs"]) == ["run5", "run4", "run3"]  # the run quiet the longest was let go
    assert view.detail("id7") is None and view.detail("id11")["content"] == "hi 11"
    assert rep["runs"]["run5"]["outcomes"] == {"prose": 1}


def test_a_record_the_analyzer_rejects_is_counted_not_fatal():
    view = LiveView()
    bad = _rec(1)
    bad.response_body = "eA=="  # base64 with an encoding the analyzer does not know
    bad.response_body_encoding = "rot13"
    view.start()
    try:
        view.observe(bad)
        view.observe(_rec(2))
        deadline = time.monotonic() + 10
        while view.classified + view.failures < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        view.stop()
    assert view.classified + view.failures == 2 and view.detail("id2") is not None
