"""Bounded fuzzing: random and mutated traffic against a live `toolproxy serve`, random and mutated
segment lines against `toolproxy analyze`. Both run as the user runs them (subprocesses).

Every run draws a new seed and prints it; TOOLPROXY_FUZZ_SEED=N replays a run exactly (the bytes
of every request and line depend only on the seed). Invariants:

* the proxy never crashes or hangs: every request gets an HTTP answer (or, when the client
  abandons its body, at least a record), and the process is alive at the end;
* nothing is lost silently: one record per exchange the proxy handled, the same count in
  /_toolproxy/stats, nothing dropped, nothing sent anywhere but the upstream;
* whatever the traffic, serve's log lines are inert on a terminal;
* analyze never crashes, stores every well-formed record and sets aside every other line, and
  stays idempotent.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson
import pytest

from toolproxy.emulators import ModelRequest, call, text, text_call
from toolproxy.record.model import Record, encode_body, new_id
from toolproxy.record.segments import read_records

SEED = int(os.environ.get("TOOLPROXY_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
REQUESTS = 600
LINES = 1000
SEQ_HEADER = "X-Fuzz-Seq"
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202eevil\r\x00"


def seeded(name: str) -> random.Random:
    return random.Random(f"{SEED}:{name}")


def replay(what: str) -> str:
    return f"{what} (fuzz seed {SEED}; replay with TOOLPROXY_FUZZ_SEED={SEED})"


def inert(text: str) -> bool:
    return not any(
        (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F or c in "\u202a\u202b\u202c\u202d\u202e"
        for c in text
    )


def test_seed_is_printed(capsys):
    """Past pytest's output capture, so a passing run shows it too (conftest.py prints it again in
    the run's summary, which is where it shows when pytest-xdist workers run the tests)."""
    with capsys.disabled():
        print(f" (fuzz seed {SEED}: replay with TOOLPROXY_FUZZ_SEED={SEED})", end=" ")


# ------------------------------------------------------------------ requests against a live proxy

PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/api/chat",
    "/api/generate",
    "/completion",
    "/v1/models",
    "/v1/responses",
    "/v1/messages",
    "/",
    "/props",
    "/v1/embeddings",
    "/nope",
]
TAGS = [
    "run=fuzz",
    "episode=%d",
    "item=i%d",
    "run=%1b%5b2J",
    "run=%ff%fe",
    "episode=a%00b",
    "run=caf%C3%A9",
    "condition=native",
    "expect=call",
    "run=" + "x" * 300,
    "run=",
    "=",
    "run=a%2Fb",
]
QUERIES = ["", "?api_key=sk-secret", "?x-api-key=k&auth=a", "?a=%ff", "?stream=true", "?" + "q" * 500, "?%1b=1"]
ODD_VALUES = [b"caf\xe9", b"\xff\xfe", b"\xc3\xa9t\xc3\xa9", b"a" * 6000, b"", b" spaced ", b"\x80" * 40]
HEADER_NAMES = [
    "X-Note",
    "X-Toolproxy-Run",
    "X-Toolproxy-Episode",
    "X-Toolproxy-Item",
    "Authorization",
    "X-Api-Key",
    "Api-Key",
    "Accept-Encoding",
    "User-Agent",
    "X-Stainless-Lang",
    "Cookie",
]


SINGLETON_HEADERS = (b"user-agent", b"host", b"content-type", b"content-length", b"transfer-encoding")


@dataclass
class Probe:
    seq: int
    raw: bytes
    # A request the HTTP layer must accept: it reaches the proxy and must leave exactly one record.
    well_formed: bool
    # The client sends part of its body and half-closes: no answer is owed, a record is.
    abandons: bool = False


def _chat_body(rng: random.Random) -> object:
    messages = [
        {
            "role": rng.choice(["user", "system", "assistant", "tool", "robot", 5]),
            "content": rng.choice(["hi", HOSTILE, "weather in Paris?", None, ["part"], {"x": 1}, "é" * 50]),
        }
        for _ in range(rng.randint(0, 4))
    ]
    body: dict = {"model": rng.choice(["m", "", 5, None, "m" + HOSTILE]), "messages": messages}
    if rng.random() < 0.6:
        body["tools"] = rng.choice(
            [
                [
                    {
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "parameters": {
                                "type": "object",
                                "properties": {"city": {"type": "string"}},
                                "required": ["city"],
                            },
                        },
                    }
                ],
                [],
                {},
                "tools",
                [5],
                [{"type": "function", "function": {"name": 7}}],
            ]
        )
    if rng.random() < 0.5:
        body["stream"] = rng.choice([True, False, "yes", 1, None])
    if rng.random() < 0.2:
        body["stream_options"] = rng.choice([{"include_usage": True}, 5])
    for key in rng.sample(
        ["temperature", "max_tokens", "tool_choice", "response_format", "n", "prompt"], rng.randint(0, 3)
    ):
        body[key] = rng.choice([0, -1, 1e308, "auto", None, {"type": "json_object"}, [1, 2], "x" * 100])
    return rng.choice([body, body, body, messages, "string", 12, None])


def _body(rng: random.Random) -> tuple[bytes, bool]:
    """(bytes, chunked)"""
    kind = rng.choice(["json", "json", "json", "truncated", "huge", "binary", "empty", "deep", "nul"])
    if kind == "json":
        raw = orjson.dumps(_chat_body(rng))
    elif kind == "truncated":
        raw = orjson.dumps(_chat_body(rng))
        raw = raw[: rng.randint(0, max(0, len(raw) - 1))]
    elif kind == "huge":
        raw = orjson.dumps(
            {
                "model": "m",
                "stream": rng.random() < 0.5,
                "messages": [{"role": "user", "content": "z" * rng.randint(200_000, 1_200_000)}],
            }
        )
    elif kind == "binary":
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3000)))
    elif kind == "deep":
        depth = rng.randint(100, 5000)
        raw = b"[" * depth + b"]" * depth
    elif kind == "nul":
        raw = b'{"model": "m\x00", "messages": [{"role": "user", "content": "\\u0000\\ud800"}]}'
    else:
        raw = b""
    return raw, rng.random() < 0.15


def _target(rng: random.Random, seq: int) -> bytes:
    path = rng.choice(PATHS)
    if rng.random() < 0.5:
        tags = "/".join(rng.choice(TAGS).replace("%d", str(seq)) for _ in range(rng.randint(1, 3)))
        path = f"/t/{tags}{path}"
    if rng.random() < 0.1:
        path = path.replace("/", "//", 1)
    if rng.random() < 0.1:
        path = "/v1/../v1" + path
    return (path + rng.choice(QUERIES)).encode()


def _chunked(body: bytes, rng: random.Random) -> bytes:
    out = b""
    pos = 0
    while pos < len(body):
        n = rng.randint(1, 70_000)
        out += b"%x\r\n" % len(body[pos : pos + n]) + body[pos : pos + n] + b"\r\n"
        pos += n
    return out + b"0\r\n\r\n"


def make_probe(rng: random.Random, seq: int) -> Probe:
    method = rng.choice([b"POST"] * 6 + [b"GET", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD", b"FUZZ"])
    target = _target(rng, seq)
    body, chunked = _body(rng) if method != b"GET" or rng.random() < 0.2 else (b"", False)
    headers: list[tuple[bytes, bytes]] = [
        (b"Host", b"127.0.0.1"),
        (SEQ_HEADER.encode(), str(seq).encode()),
        (b"Connection", b"close"),
    ]
    headers.append(
        (
            b"Content-Type",
            rng.choice(
                [
                    b"application/json",
                    b"text/plain",
                    b"application/json; charset=latin-1",
                    b"multipart/form-data",
                    b"\xff",
                ]
            ),
        )
    )
    for _ in range(rng.randint(0, 4)):
        name = rng.choice(HEADER_NAMES).encode()
        value = rng.choice(ODD_VALUES + [b"Bearer sk-" + rng.choice(ODD_VALUES), b"gzip, br", b"fuzz"])
        headers.append((name, value))
    names = [n.lower() for n, _ in headers]
    if rng.random() < 0.1:
        headers.append((b"Content-Encoding", rng.choice([b"gzip", b"deflate", b"br", b"identity"])))
    # aiohttp's parser (llhttp) knows a fixed list of methods and answers 400 to any other token
    # and answers 400 to a second User-Agent (or Host, Content-Type, ...): one value only
    well_formed = method != b"FUZZ" and all(names.count(n) == 1 for n in SINGLETON_HEADERS if n in names)
    abandons = False
    if chunked:
        headers.append((b"Transfer-Encoding", b"chunked"))
        payload = _chunked(body, rng)
    else:
        headers.append((b"Content-Length", str(len(body)).encode()))
        payload = body
    corruption = rng.random()
    if corruption < 0.06:  # protocol-level damage: the HTTP parser answers 400 before the proxy sees it
        well_formed = False
        damage = rng.choice(["ctl", "name", "length", "method", "version", "space"])
        if damage == "ctl":
            headers.append((b"X-Bad", b"a\x01b"))
        elif damage == "name":
            headers.append((b"Bad Name", b"x"))
        elif damage == "length":
            headers = [h for h in headers if h[0] not in (b"Content-Length", b"Transfer-Encoding")]
            headers.append((b"Content-Length", rng.choice([b"-1", b"abc", b"1, 2"])))
        elif damage == "method":
            method = b"G\x01T"
        elif damage == "version":
            target += b" HTTP/9.9"
        else:
            target = b"/a b"
    elif corruption < 0.1 and payload:
        abandons = True
        payload = payload[: rng.randint(0, len(payload) - 1)]
    head = method + b" " + target + b" HTTP/1.1\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in headers) + b"\r\n"
    return Probe(seq, head + payload, well_formed, abandons)


def exchange(host: str, port: int, probe: Probe, timeout: float = 30.0) -> bytes:
    """Send the probe's bytes; return everything the proxy answers until it closes."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            s.sendall(probe.raw)
            if probe.abandons:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading all of it (e.g. a 400 or 413)
        chunks = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
            if time.monotonic() > deadline:
                raise TimeoutError(f"request {probe.seq} still streaming after {timeout}s")
        return b"".join(chunks)


def hostile_model(req: ModelRequest):
    """Replies chosen by the request's content (not by arrival order), so a seed replays exactly."""
    pick = sum(len(str(m)) for m in req.messages) % 4
    if pick == 0:
        return text("plain " + HOSTILE)
    if pick == 1:
        return call("get_weather", {"city": HOSTILE})
    if pick == 2:
        return text_call("hermes", "get_" + HOSTILE, {"city": "Paris"})
    return text("")


@pytest.mark.parametrize(
    "serve_args", [(), ("--condition", "text", "--durability", "sync")], ids=["native", "text-sync"]
)
def test_fuzzed_traffic_through_a_live_proxy(fake_stack, proxy, serve_args):
    """One fake upstream and one proxy per configuration; every invariant is checked on the same
    traffic. The text condition parses and rewrites every request and reply on the hot path."""
    fake = fake_stack("llamacpp", responder=hostile_model)
    p = proxy(fake.url, *serve_args)
    url = urlsplit(p.url)
    rng = seeded("requests" + " ".join(serve_args))
    probes = [make_probe(rng, seq) for seq in range(REQUESTS)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda probe: exchange(url.hostname, url.port, probe), probes))
    print(f"{len(probes)} requests in {time.monotonic() - t0:.1f}s, seed {SEED}")
    every_request_answered_and_the_proxy_alive(p, probes, answers)
    every_exchange_recorded_once_and_counted(fake, p, probes, answers)
    log_lines_inert(p, probes)
    the_recording_analyzes(p)


def every_request_answered_and_the_proxy_alive(proxy, probes, answers):
    for probe, answer in zip(probes, answers):
        if not probe.abandons:
            assert answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), replay(
                f"request {probe.seq} got no HTTP answer: {probe.raw[:300]!r}"
            )
    assert proxy.proc.poll() is None, replay("toolproxy serve exited:\n" + proxy.output()[-3000:])
    assert proxy.health()[0] == 200, replay(f"health is not ok: {proxy.health()}")


def every_exchange_recorded_once_and_counted(fake, proxy, probes, answers):
    deadline = time.monotonic() + 120
    while True:  # the writer threads may still be writing the last records
        everything = read_records(proxy.data)  # written also counts the stack watcher's fingerprint records
        stats = proxy.stats()
        refused = stats["refused"]
        # What aiohttp's parser rejected keeps nothing of the request (its own seq header neither).
        rejected = [r for r in everything if r.get("error_kind") == "parser_rejected"]
        records = [r for r in everything if r.get("kind", "exchange") == "exchange" and r not in rejected]
        # Every exchange has its record, but refusals over the refusal budget, which are counted.
        expected = stats["exchanges"] + refused["by_kind"].get("parser_rejected", 0) - refused["not_recorded"]
        written = stats["recording"]["written"] + refused["written"]
        settled = written == len(everything) and len(records) + len(rejected) == expected
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    recording = stats["recording"]
    assert (recording["dropped"], recording["write_failures"], refused["dropped"]) == (0, 0, 0), replay(
        f"stats: {stats}"
    )
    assert len(records) + len(rejected) == expected, replay(
        f"{len(records) + len(rejected)} records on disk, stats say {stats}"
    )
    assert written == len(everything), replay(f"{len(everything)} records on disk, stats say {stats}")
    assert refused["by_kind"].get("parser_rejected", 0) <= sum(not p.well_formed for p in probes)
    seqs: dict[int, int] = {}
    for rec in records:
        seq = next((v for n, v in rec["request_headers"] if n.lower() == SEQ_HEADER.lower()), None)
        assert seq is not None, replay(f"a record without its {SEQ_HEADER}: {rec['id']} {rec['path']!r}")
        seqs[int(seq)] = seqs.get(int(seq), 0) + 1
        assert rec["upstream"] == fake.url, replay(f"record {rec['id']} went to {rec['upstream']!r}")
        assert rec["error_kind"] != "proxy_error", replay(
            f"request {seq} failed inside the proxy: {rec['error_message']}"
        )
    twice = {s: n for s, n in seqs.items() if n > 1}
    assert not twice, replay(f"requests recorded more than once: {twice}")
    missing = [p.seq for p in probes if p.well_formed and p.seq not in seqs]
    assert not missing, replay(
        "well-formed requests without a record: "
        + "\n".join(f"{probes[s].raw[:300]!r} answered {answers[s][:300]!r}" for s in missing[:3])
    )
    assert len(records) >= sum(p.well_formed for p in probes)


def log_lines_inert(proxy, probes):
    """serve's line per exchange is printed by the live classifier once it has dealt with the
    exchange (classified it, or counted it without): wait for that, then every exchange has one.
    The classifier only runs on CPU nothing else wants, so on a busy machine that takes a while."""
    deadline = time.monotonic() + 180
    while True:
        with urllib.request.urlopen(proxy.url + "/_toolproxy/live?limit=1", timeout=10) as r:
            live = orjson.loads(r.read())
        dealt = live["classified"] + live["failures"] + sum(live["unclassified"].values())
        if dealt >= live["observed"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # the classifier prints a slice's lines once the slice is counted
    lines = "".join(proxy.stdout)
    assert len(lines.splitlines()) > len(probes) / 2
    outcomes = [line for line in lines.splitlines() if not line.startswith("toolproxy ") and " -> " in line]
    assert len(outcomes) == live["observed"], replay(
        f"{live['observed']} exchanges, {len(outcomes)} lines with an outcome"
    )
    assert inert(lines), replay(
        "serve printed raw control characters: " + repr(next(line for line in proxy.stdout if not inert(line)))
    )


def the_recording_analyzes(proxy):
    n = len(proxy.records())
    r = toolproxy("analyze", "--data", str(proxy.data))
    assert r.returncode == 0 and "Traceback" not in r.stderr, replay(r.stdout + r.stderr)
    assert f"new exchanges: {n};" in r.stdout and "set aside" not in r.stdout, replay(r.stdout)


# ------------------------------------------------------------------ segment lines against analyze


def toolproxy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _reply_body(rng: random.Random) -> bytes:
    choice = rng.random()
    if choice < 0.4:
        return orjson.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": rng.choice(["hi", HOSTILE, None]),
                            "tool_calls": rng.choice(
                                [
                                    None,
                                    [],
                                    [
                                        {
                                            "id": "c",
                                            "type": "function",
                                            "function": {
                                                "name": rng.choice(["get_weather", 5, None, HOSTILE]),
                                                "arguments": rng.choice(['{"city":"Oslo"}', "{bad", {"city": 1}, 7]),
                                            },
                                        }
                                    ],
                                ]
                            ),
                        },
                        "finish_reason": rng.choice(["stop", "tool_calls", None, 3, {"x": 1}]),
                    }
                ],
                "usage": rng.choice([None, {"prompt_tokens": rng.choice([1, -5, "x", 2**64 - 1, 1.5])}]),
                "model": rng.choice(["m", 5, None]),
            }
        )
    if choice < 0.6:
        events = [
            b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": rng.choice(["a", HOSTILE, 5])}}]})
            for _ in range(rng.randint(0, 5))
        ]
        return b"\n\n".join(events + [b"data: [DONE]"])[: rng.randint(0, 4000)]
    if choice < 0.8:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 500)))
    return orjson.dumps(rng.choice([[], {}, "x", {"error": {"message": HOSTILE}}, {"choices": "x"}]))


def good_record(rng: random.Random) -> dict:
    rec = Record(
        id=new_id(),
        started_at=rng.choice([time.time(), 0, 1.5e9, -1.0]),
        run=rng.choice([None, "r1", HOSTILE, ""]),
        episode=rng.choice([None, "1", "2", "é"]),
        item=rng.choice([None, "i"]),
        method=rng.choice(["POST", "GET", "FUZZ"]),
        path=rng.choice(PATHS),
        upstream="http://127.0.0.1:9",
        condition=rng.choice(["native", "text", "weird"]),
        tags=rng.choice([{}, {"expect": "call"}, {"k": HOSTILE}]),
    )
    rec.request_headers = rng.choice([[], [["content-type", "application/json"]], [["x-note", "café"]], [["a"]], "x"])
    rec.request_body, rec.request_body_encoding = encode_body(
        orjson.dumps(_chat_body(rng)) if rng.random() < 0.8 else bytes(rng.randrange(256) for _ in range(50))
    )
    rec.status = rng.choice([200, 400, 500, None, 0, 2**31 - 1])
    rec.client_status = rng.choice([None, rec.status])
    rec.response_headers = rng.choice(
        [
            [["content-type", "application/json"]],
            [["content-type", "text/event-stream"]],
            [["content-encoding", "gzip"]],
            [],
        ]
    )
    rec.response_body, rec.response_body_encoding = encode_body(_reply_body(rng))
    rec.ttfb_ms, rec.duration_ms = rng.choice([(None, None), (1.0, 2.0), (0, 10**15)])
    rec.error_kind = rng.choice([None, "timeout", "client_closed", HOSTILE])
    rec.extra = rng.choice([{}, {"later_errors": [{"kind": "x", "message": "y"}]}])
    d = orjson.loads(orjson.dumps(rec, default=str))
    if rng.random() < 0.1:
        d["kind"] = "fingerprint"
        d["extra"] = rng.choice([{"stack": "llamacpp", "version": "b1"}, {"stack": 5}, {"stack": {"name": "vllm"}}])
    return d


WRONG = [
    ("status", [2**40, True, "200", 1.5, [200]]),
    ("started_at", ["yesterday", 1e300, True, {}]),
    ("run", [5, {}, {"a": 1}, ["r"], False]),
    ("path", [5, ["/"]]),
    ("method", [1, {}]),
    ("ttfb_ms", ["fast", [1]]),
    ("request_body", [12, {"a": 1}]),
    ("client_status", [-(2**40), "x"]),
    ("condition", [7, ["a"]]),
    ("kind", [3, ["exchange"]]),
    ("error_message", [{"m": 1}]),
]


def bad_line(rng: random.Random) -> tuple[bytes, str]:
    """(line without its newline, the issue kind it must be set aside as)"""
    kind = rng.choice(["type", "type", "type", "json", "truncated", "array", "noid", "utf8", "deep", "chunks"])
    if kind == "type":
        rec = good_record(rng)
        field, values = rng.choice(WRONG)
        rec[field] = rng.choice(values)
        return orjson.dumps(rec), "bad_type"
    if kind == "truncated":
        raw = orjson.dumps(good_record(rng))
        return raw[: rng.randint(1, len(raw) - 2)], "corrupt"
    if kind == "array":
        return orjson.dumps([good_record(rng)]), "corrupt"
    if kind == "noid":
        rec = good_record(rng)
        rec["id"] = rng.choice([None, "", 5])
        if rec["id"] is None:
            del rec["id"]
        return orjson.dumps(rec), "corrupt"
    if kind == "utf8":
        return orjson.dumps(good_record(rng)).replace(b'"POST"', b'"P\xffST"').replace(b'"GET"', b'"G\xffT"').replace(
            b'"FUZZ"', b'"\xc3"'
        ), "corrupt"
    if kind == "chunks":  # a body stored as chunk references that lead nowhere
        rec = good_record(rng)
        rec[rng.choice(["request_body", "response_body"]) + "_chunks"] = rng.choice(
            [[10**9], "x", [-1], [0], [1.5], {}]
        )
        return orjson.dumps(rec), "corrupt"
    if kind == "deep":
        return b"[" * 3000 + b"]" * 3000, "corrupt"
    return rng.choice([b"{not json", b"\x00\x01\x02", b"nul\x00l", b'{"id": "x", }', b"\xef\xbb\xbf{}"]), "corrupt"


def test_analyze_ingests_every_good_line_and_sets_aside_the_rest(tmp_path):
    rng = seeded("lines")
    seg = tmp_path / "data" / "segments"
    seg.mkdir(parents=True)
    good: set[str] = set()
    fingerprints: set[str] = set()
    expected: dict[str, int] = {}
    files: dict[str, list[bytes]] = {f"2026113{i}T000000-1-0001.jsonl": [] for i in range(3)}
    for _ in range(LINES):
        name = rng.choice(list(files))
        if rng.random() < 0.7:
            rec = good_record(rng)
            (fingerprints if rec.get("kind") == "fingerprint" else good).add(rec["id"])
            files[name].append(orjson.dumps(rec))
        else:
            line, kind = bad_line(rng)
            files[name].append(line)
            expected[kind] = expected.get(kind, 0) + 1
    for name, lines in files.items():
        (seg / name).write_bytes(b"".join(line + b"\n" for line in lines))
    (seg / "20261140T000000-1-0001.jsonl").mkdir()

    r = toolproxy("analyze", "--data", str(tmp_path / "data"), "--batch-mb", str(rng.choice([0.01, 0.1, 8])))
    assert r.returncode == 0 and "Traceback" not in r.stderr, replay(r.stdout + r.stderr)
    assert inert(r.stdout + r.stderr), replay("analyze printed raw control characters")
    q = toolproxy(
        "sql",
        "--data",
        str(tmp_path / "data"),
        "--format",
        "json",
        "select (select count(*) from exchanges) as exchanges, (select count(*) from fingerprints) as fps, "
        "(select list(id) from exchanges) as ids",
    )
    assert q.returncode == 0, replay(q.stderr)
    got = orjson.loads(q.stdout)[0]
    missing = good - set(got["ids"])
    assert not missing, replay(f"well-formed records not ingested: {sorted(missing)[:5]}\n{r.stdout}")
    assert (got["exchanges"], got["fps"]) == (len(good), len(fingerprints)), replay(r.stdout)
    q = toolproxy(
        "sql",
        "--data",
        str(tmp_path / "data"),
        "--format",
        "json",
        "select kind, count(*) as n from ingest_issues group by kind",
    )
    issues = {row["kind"]: row["n"] for row in orjson.loads(q.stdout)}
    assert issues == expected, replay(f"set aside {issues}, expected {expected}\n{r.stdout}")

    again = toolproxy("analyze", "--data", str(tmp_path / "data"))
    assert again.returncode == 0 and "new exchanges: 0;" in again.stdout and "set aside" not in again.stdout, replay(
        again.stdout
    )
    for cmd in (["report"], ["report", "--format", "markdown"], ["sql", "select * from exchanges limit 50"]):
        out = toolproxy(*cmd, "--data", str(tmp_path / "data"))
        assert out.returncode == 0 and inert(out.stdout), replay(f"{cmd}: {out.stdout[-2000:]} {out.stderr[-2000:]}")
    for rid in rng.sample(sorted(good), 3):
        out = toolproxy("show", "--raw", "--data", str(tmp_path / "data"), rid)
        assert out.returncode == 0 and inert(out.stdout), replay(
            f"show {rid}: {out.stdout[-2000:]} {out.stderr[-2000:]}"
        )
