"""--mask, in bounded time and memory, missing nothing: the masker as a pure function (linear
time on adversarial input, keys and escaped spellings, exact counts, streams cut anywhere), then
a real proxy (a huge body masked while others pass, SIGTERM, the spill file on disk, peak memory,
the response bound)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from toolproxy.record import jsonlexer, masking
from toolproxy.record.masking import BUILTIN, Masker

KEY = b"k" * 32
M = Masker(list(BUILTIN.values()), KEY)
EMAIL = "jane.doe@example.com"


def tok(value: str) -> str:
    return M.token(value)


# ---- time: linear on what made Python's re quadratic --------------------------------------------

# Per built-in rule, text that makes a backtracking matcher retry from every position.
ADVERSARIAL = {
    "email": lambda n: "a" * n,  # a run of address characters with no @
    "email-domain": lambda n: "a@" + "b." * (n // 2),
    "api-key": lambda n: "sk-" + "a" * n + "!",
    "credit-card": lambda n: "1 2 3 4 5 6 7 8 9 0 1 2 x " * (n // 26),  # 12 digits, never 13
    "ipv4": lambda n: "1.1.1.a " * (n // 8),
    "bearer": lambda n: "Bearer " + " " * n,
    "lines": lambda n: 'data: {"choices":[{"delta":{"content":"a"}}]}\n' * (n // 46),  # a stream of small events
}

TIMING = r"""
import json, sys
from collections import Counter
from toolproxy.record.masking import BUILTIN, Masker
sys.path.insert(0, {tests!r})
from scaling import assert_scales_linearly
from test_masking_bounds import ADVERSARIAL

def masking(n, make):
    s = make(n)
    doc = json.dumps({{"messages": [{{"role": "user", "content": s}}]}})
    def run():
        m = Masker(list(BUILTIN.values()), b"k" * 32)  # nothing remembered from the last call
        m.text(s, Counter()); m.body(doc, Counter()); m.body(s, Counter())
        m.pieces([s[: n // 2], s[n // 2:]], Counter())
    return run

out = {{}}
for name, make in ADVERSARIAL.items():
    try:
        out[name] = assert_scales_linearly(masking({small}, make), masking({large}, make), name, max_references=250)
    except AssertionError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def test_every_builtin_pattern_scales_linearly_on_adversarial_input():
    """8x the text takes about 8x the time (quadratic would be 64x, and minutes), measured in one
    run with scaling.py's retries and reference budget; in a child with a deadline, since a
    quadratic matcher holds the GIL and ignores signals (the deadline is for a hang, not a speed
    claim)."""
    small, large = 300_000, 2_400_000  # both longer than a parsed line (LINE_CHARS): one path for both
    code = TIMING.format(tests=str(__import__("pathlib").Path(__file__).parent), small=small, large=large)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ratios = json.loads(r.stdout)
    assert sorted(ratios) == sorted(ADVERSARIAL)
    assert {name: ratio for name, ratio in ratios.items() if isinstance(ratio, str)} == {}


def test_user_patterns_are_linear_too_and_rre2_refuses_what_it_cannot_run():
    m = Masker(masking.parse_rules([r"(a+)+b"]), KEY)  # catastrophic for a backtracking matcher
    hits: Counter = Counter()
    assert m.text("a" * 50_000 + "c", hits) == "a" * 50_000 + "c" and not hits
    with pytest.raises(ValueError, match="RE2"):
        masking.parse_rules([r"(?<=x)secret"])
    with pytest.raises(ValueError, match="RE2"):
        masking.parse_rules([r"(\w)\1"])


# ---- nothing missed, counted exactly ---------------------------------------------------------


def tokens_in(doc) -> int:
    """How many mask tokens a JSON value holds (keys and strings)."""
    text = json.dumps(doc)
    return text.count("masked:")


@pytest.mark.parametrize(
    "body, expected",
    [
        # an object key is personal data as much as a value
        ('{"metadata":{"jane@x.com":"v"}}', {"metadata": {tok("jane@x.com"): "v"}}),
        (
            '{"a":{"jane@x.com":{"bob@y.org":"bob@y.org"}}}',
            {"a": {tok("jane@x.com"): {tok("bob@y.org"): tok("bob@y.org")}}},
        ),
        # escaped spellings of the same text
        ('{"c":"jane\\u0040x.com"}', {"c": tok("jane@x.com")}),
        ('{"c":"jane\\u002edoe\\u0040x\\u002ecom"}', {"c": tok("jane.doe@x.com")}),
        ('{"c":"key sk\\u002dABCDEFGHIJKLMNOPQRST"}', {"c": "key " + tok("sk-ABCDEFGHIJKLMNOPQRST")}),
    ],
)
def test_keys_and_escaped_spellings_are_masked(body, expected):
    hits: Counter = Counter()
    out = M.body(body, hits)
    assert json.loads(out) == expected
    assert sum(hits.values()) == tokens_in(expected)


@pytest.mark.parametrize("depth", [10, 260, 1000, 1100])
def test_escaped_values_deep_in_a_body_are_masked_and_counted_as_written(depth):
    """Past orjson's depths (254 to write, 1024 to read) the body is read as JSON text: each
    string decoded, masked and written again; before, `\\u0040` there was written as sent and
    still counted as masked."""
    deep = "[" * depth + '{"jane\\u0040x.com":"bob\\u0040y.org"}' + "]" * depth
    for body in (deep, f"data: {deep}\n\ndata: [DONE]\n\n"):
        hits: Counter = Counter()
        out = M.body(body, hits)
        assert "jane" not in out and "bob" not in out, out[depth - 5 : depth + 80]
        assert hits == {"email": 2} and out.count("masked:") == 2
        payload = out[6 : out.index("\n")] if body.startswith("data:") else out
        inner = json.loads(payload) if depth < 1000 else None
        if inner is not None:
            for _ in range(depth):
                inner = inner[0]
            assert inner == {tok("jane@x.com"): tok("bob@y.org")}


def test_counts_are_exactly_the_replacements_written():
    body = json.dumps(
        {
            "messages": [
                {"role": "user", "content": f"{EMAIL} {EMAIL} 4111 1111 1111 1111, host 10.0.0.1"},
                {"role": "tool", "content": "nothing here"},
            ],
            EMAIL: 1,
        }
    )
    hits: Counter = Counter()
    out = M.body(body, hits)
    assert hits == {"email": 3, "credit-card": 1, "ipv4": 1}
    assert out.count("masked:") == sum(hits.values())


def test_overlapping_rules_mask_once():
    m = Masker(masking.parse_rules(["email", r"example\.com"]), KEY)
    hits: Counter = Counter()
    assert m.text(f"to {EMAIL}", hits) == f"to {m.token(EMAIL)}" and hits == {"email": 1}


# ---- streams cut anywhere, windows of any size ---------------------------------------------------


def sse_body(pieces: list[str], n_filler: int) -> str:
    events = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    events = [{"choices": [{"index": 0, "delta": {"content": "word "}}]}] * n_filler + events
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def content_of(body: str) -> str:
    out = []
    for line in body.split("\n"):
        if line.startswith("data: {"):
            out.append(json.loads(line[6:])["choices"][0]["delta"]["content"])
    return "".join(out)


@pytest.mark.parametrize("cut", range(1, len(EMAIL)))
def test_small_windows_find_what_whole_masking_finds(monkeypatch, cut):
    """With events held back for only a few hundred characters, and the body fed in 7-character
    texts, an address split across two deltas at any point is still found whole."""
    pieces = ["Reach ", EMAIL[:cut], EMAIL[cut:] + " now"]
    body = sse_body(pieces, n_filler=200)
    whole = M.body(body, Counter())
    monkeypatch.setattr(jsonlexer, "HOLD_CHARS", 300)
    monkeypatch.setattr(jsonlexer, "OVERLAP", 64)
    hits: Counter = Counter()
    streamed = "".join(M.stream([body[i : i + 7] for i in range(0, len(body), 7)], hits))
    assert content_of(streamed) == content_of(whole) == "word " * 200 + f"Reach {tok(EMAIL)} now"
    assert hits == {"email": 1} and EMAIL not in streamed
    assert streamed.count("\n") == body.count("\n")


@pytest.mark.parametrize("where", [0, 1, 100, 4095, 4096, 9000])
def test_a_long_json_string_is_masked_across_windows(monkeypatch, where):
    monkeypatch.setattr(jsonlexer, "LINE_CHARS", 1000)
    monkeypatch.setattr(jsonlexer, "WINDOW_CHARS", 2000)
    monkeypatch.setattr(jsonlexer, "OVERLAP", 100)
    content = "x " * 5000
    content = content[:where] + f" {EMAIL}\\u0040 é\n" + content[where:]
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content, EMAIL: "k"}]})
    for size in (1, 13, 4096, len(body)):
        hits: Counter = Counter()
        out = "".join(M.stream([body[i : i + size] for i in range(0, len(body), size)], hits))
        doc = json.loads(out)
        expected = content.replace(EMAIL, tok(EMAIL))
        assert doc["messages"][0]["content"] == expected and doc["messages"][0][tok(EMAIL)] == "k"
        assert hits == {"email": 2} and EMAIL not in out


def test_a_long_line_of_text_is_masked_across_windows(monkeypatch):
    monkeypatch.setattr(jsonlexer, "LINE_CHARS", 500)
    monkeypatch.setattr(jsonlexer, "WINDOW_CHARS", 1000)
    monkeypatch.setattr(jsonlexer, "OVERLAP", 50)
    text = ("lorem ipsum " * 400 + EMAIL + " ") * 5
    hits: Counter = Counter()
    out = "".join(M.stream([text[i : i + 333] for i in range(0, len(text), 333)], hits))
    assert out == text.replace(EMAIL, tok(EMAIL)) and hits == {"email": 5}


def test_a_match_longer_than_a_window_is_masked_in_pieces_not_left(monkeypatch):
    monkeypatch.setattr(jsonlexer, "LINE_CHARS", 500)
    monkeypatch.setattr(jsonlexer, "WINDOW_CHARS", 1000)
    monkeypatch.setattr(jsonlexer, "OVERLAP", 50)
    m = Masker(masking.parse_rules([r"SECRET[a-z]+"]), KEY)
    text = "x SECRET" + "q" * 5000 + " y"
    out = "".join(m.stream([text[i : i + 100] for i in range(0, len(text), 100)], Counter()))
    assert "q" * 60 not in out and out.startswith("x masked:") and out.endswith(" y")


def test_repeated_history_is_masked_from_memory():
    """An agent resends its history every turn: a string seen before is not matched again."""
    m = Masker(list(BUILTIN.values()), KEY)
    history = [{"role": "user", "content": f"turn {i}: {EMAIL} " + "filler " * 50} for i in range(40)]
    body = json.dumps({"messages": history})
    first, again = Counter(), Counter()
    out1 = m.body(body, first)
    calls = []
    spans = m.spans
    m.spans = lambda s: calls.append(s) or spans(s)
    out2 = m.body(body, again)
    assert out1 == out2 and first == again == {"email": 40}
    assert not [s for s in calls if len(s) >= masking.CACHE_MIN_CHARS]  # long strings came from memory


# ---- a real proxy ------------------------------------------------------------------------------


def _post(url: str, body: bytes, timeout: float = 60) -> tuple[int, bytes, float]:
    import time
    import urllib.request

    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read(), time.perf_counter() - t0


def _chat(content: str, model: str, **extra) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}], **extra}).encode()


def test_a_huge_body_is_masked_while_other_requests_pass_and_sigterm_still_stops_the_proxy(fake_stack, proxy):
    """40 MB of address characters without an @ kept Python's re busy for hours, holding the GIL:
    every other request waited, and SIGTERM went unanswered. Masked now in linear time, off the
    writer, in windows."""
    import threading
    import time

    from toolproxy.emulators import text

    fake = fake_stack("llamacpp", responder=lambda req: text("ok"))
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--no-live-page", "--mask", "email")
    huge = _chat("a" * 40_000_000 + f" {EMAIL}", fake.model)
    done = []
    big = threading.Thread(target=lambda: done.append(_post(p.url, huge)))
    big.start()
    big.join(60)
    assert done and done[0][0] == 200
    waits = []
    for i in range(40):  # for two seconds: past the writer's backpressure bound (0.1 s)
        waits.append(_post(p.url, _chat(f"small {i}", fake.model))[2])
        time.sleep(0.05)
    assert max(waits) < 1.0, waits
    recs = p.wait_records(41, timeout=60)
    assert len(recs) == 41 and p.stats()["recording"]["dropped"] == 0
    raw = b"".join(f.read_bytes() for f in (p.data / "segments").iterdir())
    assert EMAIL.encode() not in raw
    (rec,) = [r for r in recs if r["request_body_size"] > 1_000_000]
    assert rec["extra"]["masked"] == {"email": 1}

    # Again, and SIGTERM while that body is being masked: the proxy stops within seconds.
    assert _post(p.url, huge)[0] == 200
    masking_seen = p.stats()["recording"]["masking"]["spilled_waiting"]
    t0 = time.monotonic()
    p.terminate()
    p.proc.wait(15)
    assert time.monotonic() - t0 < 10, masking_seen


def test_spilled_bodies_are_encrypted_in_their_temporary_file(fake_stack, proxy):
    """A body over --spill-above waits in a file while its exchange runs; what is in the file
    must not be the prompt."""
    import os
    import threading
    import time

    from toolproxy.emulators import stall

    fake = fake_stack("llamacpp")
    fake.inject(stall(before=4))
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--no-live-page")
    marker = "PROMPT-MARKER-" + "z" * 20
    body = _chat((marker + " ") * 100_000, fake.model)  # ~3.5 MB: spilled
    t = threading.Thread(target=_post, args=(p.url, body))
    t.start()
    spill = p.data / "spill"
    found = []
    deadline = time.monotonic() + 3.5
    while not found and time.monotonic() < deadline:
        time.sleep(0.1)
        fd_dir = f"/proc/{p.proc.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith(str(spill)):
                with open(f"{fd_dir}/{fd}", "rb") as f:
                    data = f.read()
                if len(data) >= len(body):
                    found.append(data)
    t.join(30)
    assert found, "no spill file of the body's size was open"
    assert all(marker.encode()[:12] not in data for data in found)
    (rec,) = p.wait_records(1)
    assert marker in rec["request_body"]  # the record itself still has every byte


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_masking_a_large_reply_takes_bounded_memory(fake_stack, proxy):
    """A 200 MB reply peaked at 912 MB masked (56 MB not): read back whole, decoded, parsed and
    written again. Masked as it is read back now; measured against the same reply unmasked."""
    from toolproxy.emulators import text

    content = ("lorem ipsum dolor sit amet " * 2_400_000) + EMAIL  # ~65 MB
    fake = fake_stack("llamacpp", responder=lambda req: text(content))
    peaks = {}
    for name, args in (("plain", ()), ("masked", ("--mask", "email"))):
        p = proxy(fake.url, "--quiet", "--no-fingerprint", "--no-live-page", "--durability", "sync", *args)
        status, got, _ = _post(p.url, _chat("hi", fake.model), timeout=120)
        assert status == 200 and len(got) > 60_000_000
        del got
        (rec,) = p.wait_records(1, timeout=60)
        peaks[name] = _peak_rss_kib(p.proc.pid)
        if name == "masked":
            assert rec["extra"]["masked"] == {"email": 1} and EMAIL not in rec["response_body"]
        del rec
        p.stop()
    assert peaks["masked"] < 2 * peaks["plain"], peaks


def test_a_response_above_max_response_is_refused_or_cut_and_recorded(fake_stack, proxy):
    import http.client
    from urllib.parse import urlsplit

    from toolproxy.emulators import text

    big = "x" * 300_000
    fake = fake_stack("llamacpp", responder=lambda req: text(big))
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--max-response", "100KiB", "--durability", "sync")
    # Announced too large (Content-Length): a 502 before anything is sent.
    u = urlsplit(p.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", _chat("hi", fake.model), {"Content-Type": "application/json"})
    r = conn.getresponse()
    answer = r.read()
    assert r.status == 502 and json.loads(answer)["error"]["code"] == "response_too_large"
    conn.close()
    # Streamed (chunked, no length): cut where it passes the limit.
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request(
        "POST", "/v1/chat/completions", _chat("hi", fake.model, stream=True), {"Content-Type": "application/json"}
    )
    r = conn.getresponse()
    assert r.status == 200
    with pytest.raises(http.client.IncompleteRead) as cut:
        r.read()
    assert len(cut.value.partial) <= 100 * 1024
    conn.close()
    recs = p.wait_records(2)
    assert [x["error_kind"] for x in recs] == ["response_too_large", "response_too_large"]
    assert [x["client_status"] for x in recs] == [502, 200]
    assert "--max-response" in recs[1]["error_message"] and len(recs[1]["response_body"]) <= 100 * 1024 + 65536


def test_keys_are_masked_in_the_record_and_on_the_live_page(fake_stack, proxy):
    import time
    import urllib.request

    from toolproxy.emulators import text

    fake = fake_stack("llamacpp", responder=lambda req: text("done"))
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--mask", "email", "--durability", "sync")
    body = json.dumps(
        {"model": fake.model, "messages": [{"role": "user", "content": "hi"}], "metadata": {"jane@x.com": "v"}}
    ).encode()
    assert _post(p.url, body)[0] == 200
    (rec,) = p.wait_records(1)
    assert rec["extra"]["masked"] == {"email": 1}
    assert json.loads(rec["request_body"])["metadata"] == {
        M.__class__(list(BUILTIN.values()), masking.load_key(p.data)).token("jane@x.com"): "v"
    }
    raw = b"".join(f.read_bytes() for f in (p.data / "segments").iterdir())
    assert b"jane@x.com" not in raw
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{p.url}/_toolproxy/exchange/{rec['id']}", timeout=5) as r:
                detail = r.read().decode()
            break
        except urllib.error.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert "jane@x.com" not in detail and "masked:" in detail
