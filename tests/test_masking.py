"""--mask: the rules as a table, then a real proxy recording masked bodies while the client gets
the real bytes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections import Counter

import aiohttp
import pytest

from toolproxy.emulators import text
from toolproxy.record.masking import BUILTIN, Masker, load_key, luhn, parse_rules

KEY = b"k" * 32
M = Masker(list(BUILTIN.values()), KEY)


@pytest.mark.parametrize(
    "value, rule, masked",
    [
        ("mail bob.smith+x@example.co.uk now", "email", True),
        ("not@an address", "email", False),
        ("Authorization: Bearer abcdefghijklmnop1234", "api-key", True),
        ("key sk-proj-ABCDEFGHIJKLMNOP1234", "api-key", True),
        ("aws AKIAABCDEFGHIJKLMNOP", "api-key", True),
        ("card 4111 1111 1111 1111 ok", "credit-card", True),
        ("card 4111-1111-1111-1112 fails luhn", "credit-card", False),
        ("order 1234567890123 no", "credit-card", False),
        ("host 192.168.10.254 up", "ipv4", True),
        ("version 1.2.3.400", "ipv4", False),
    ],
)
def test_builtin_rules(value, rule, masked):
    hits: Counter = Counter()
    out = M.text(value, hits)
    assert (hits[rule] > 0) == masked, (out, hits)
    assert ("masked:" in out) == masked


def test_luhn():
    assert luhn("4111111111111111") and luhn("79927398713") and not luhn("79927398710")


def test_same_value_same_token_and_key_matters():
    hits: Counter = Counter()
    a = M.text("a@example.com and a@example.com and b@example.com", hits)
    tokens = a.split(" and ")
    assert tokens[0] == tokens[1] != tokens[2] and hits["email"] == 3
    other = Masker(list(BUILTIN.values()), b"x" * 32).text("a@example.com", Counter())
    assert other != tokens[0]


def test_json_stays_valid_and_escaped_values_are_seen():
    hits: Counter = Counter()
    body = json.dumps(
        {
            "messages": [
                {"role": "user", "content": 'write to "bob@example.com"\nthanks'},
                {"role": "tool", "content": "a\u0040b.org"},
            ]
        },
        ensure_ascii=True,
    )
    body = body.replace("@b.org", "\\u0040b.org")  # a value the JSON text spells with an escape
    out = M.body(body, hits)
    doc = json.loads(out)
    assert "bob@example.com" not in out and "a@b.org" not in json.dumps(doc)
    assert doc["messages"][0]["content"].startswith('write to "masked:') and hits["email"] == 2


def test_sse_and_ndjson_lines_are_masked_and_framing_kept():
    hits: Counter = Counter()
    sse = 'data: {"choices":[{"delta":{"content":"mail a@example.com"}}]}\n\ndata: [DONE]\n\n'
    out = M.body(sse, hits)
    assert out.startswith("data: {") and out.endswith("data: [DONE]\n\n") and "a@example.com" not in out
    json.loads(out.split("\n")[0][6:])
    nd = '{"message":{"content":"a@example.com"}}\n{"done":true}\n'
    out = M.body(nd, hits)
    assert [json.loads(x) for x in out.strip().split("\n")][1] == {"done": True} and hits["email"] == 2


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        parse_rules(["(unclosed"])
    with pytest.raises(ValueError, match="empty string"):
        parse_rules(["x*"])
    assert [r.name for r in parse_rules(["email", r"ACME-\d+"])] == ["email", r"ACME-\d+"]


def test_key_file_is_private_and_stable(tmp_path):
    k = load_key(tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / "mask.key").st_mode) == 0o600
    assert load_key(tmp_path) == k and len(k) == 32


SECRET = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"


@pytest.mark.parametrize("stream", [False, True])
async def test_proxy_records_masked_bodies_and_client_gets_the_real_ones(fake_stack, proxy, stream):
    fake = fake_stack("llamacpp", replies=[text(f"Reach {SECRET} about ACME-1234")])
    p = proxy(
        fake.url,
        "--quiet",
        "--no-fingerprint",
        "--durability",
        "sync",
        "--mask",
        "email",
        "--mask",
        "credit-card",
        "--mask",
        r"ACME-\d+",
    )
    body = {
        "model": "m",
        "stream": stream,
        "messages": [{"role": "user", "content": f"My card is {CARD}, mail {SECRET}"}],
    }
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json=body) as r:
            got = (await r.read()).decode()
    assert r.status == 200
    if stream:
        events = [json.loads(x[6:]) for x in got.split("\n") if x.startswith("data: {")]
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    else:
        content = json.loads(got)["choices"][0]["message"]["content"]
    assert content == f"Reach {SECRET} about ACME-1234"  # the client's bytes are untouched
    assert json.loads(fake.seen[-1].body)["messages"][0]["content"].endswith(SECRET)  # and so is the upstream's

    (rec,) = p.wait_records(1)
    raw = b"".join(f.read_bytes() for f in (p.data / "segments").iterdir())
    assert SECRET.encode() not in raw and b"4111" not in raw and b"ACME-1234" not in raw
    assert rec["extra"]["masked"] == {"email": 2, "credit-card": 1, r"ACME-\d+": 1}
    req = json.loads(rec["request_body"])
    assert req["messages"][0]["content"].startswith("My card is masked:")
    r = subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", "analyze", "--data", str(p.data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "issues: none" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "sql",
            "--data",
            str(p.data),
            "--format",
            "json",
            "SELECT content FROM exchanges",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    (row,) = json.loads(r.stdout)
    assert row["content"].startswith("Reach masked:") and SECRET not in row["content"]


def test_bad_mask_is_a_usage_error(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--data",
            str(tmp_path),
            "--mask",
            "(oops",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "not a valid regular expression" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "parts, masked",
    [
        (["mail jane.do", "e@example.com now"], ["mail ", " now"]),
        (["jane.doe@exa", "mple.com"], ["", ""]),
        (["a ", "jane", ".doe@", "example", ".com", " b"], ["a ", "", "", "", "", " b"]),
        (["a@b.co", " and ", "c@d.org"], ["", " and ", ""]),
        (["no secret here"], ["no secret here"]),
    ],
)
def test_pieces_are_masked_as_one_text(parts, masked):
    hits: Counter = Counter()
    out = M.pieces(parts, hits)
    assert len(out) == len(parts)
    assert "".join(out) == M.text("".join(parts), Counter())  # reads as the text masked whole
    # the token sits in the piece where its match starts; the pieces it spans lose their characters
    assert [
        p.replace(M.token("jane.doe@example.com"), "").replace(M.token("a@b.co"), "").replace(M.token("c@d.org"), "")
        for p in out
    ] == masked


SPLIT_SECRET = "jane.doe@example.com"
SPLIT_TEXT = f"Reach {SPLIT_SECRET} now"


async def test_a_secret_split_across_streamed_deltas_is_masked_in_every_protocol(fake_stack, proxy, monkeypatch):
    """Each protocol's stream, with the secret cut at every position into two deltas by the
    emulated stack; the client gets the stream as sent, the record reassembles to the masked text."""
    from toolproxy import emulators as fakes
    from toolproxy.wire import decode, family_of

    cut = {"at": None}

    def pieces(s: str) -> list[str]:
        if s != SPLIT_TEXT or cut["at"] is None:
            return [s]
        at = SPLIT_TEXT.index(SPLIT_SECRET) + cut["at"]
        return [s[:at], s[at:]]

    monkeypatch.setattr(fakes.encoding, "pieces", pieces)
    llama = fake_stack("llamacpp", responder=lambda req: text(SPLIT_TEXT))
    ollama = fake_stack("ollama", responder=lambda req: text(SPLIT_TEXT))
    p_llama = proxy(llama.url, "--quiet", "--no-fingerprint", "--durability", "sync", "--mask", "email")
    p_ollama = proxy(ollama.url, "--quiet", "--no-fingerprint", "--durability", "sync", "--mask", "email")
    user = [{"role": "user", "content": "Who?"}]
    requests = [
        (p_llama, "/v1/chat/completions", {"model": llama.model, "messages": user, "stream": True}),
        (p_llama, "/v1/responses", {"model": llama.model, "input": "Who?", "stream": True}),
        (p_llama, "/v1/messages", {"model": llama.model, "max_tokens": 64, "messages": user, "stream": True}),
        (p_ollama, "/api/chat", {"model": ollama.model, "messages": user, "stream": True}),
    ]
    sent = 0
    async with aiohttp.ClientSession() as s:
        for at in range(1, len(SPLIT_SECRET)):
            cut["at"] = at
            for p, path, body in requests:
                async with s.post(p.url + path, json=body) as r:
                    got = await r.read()
                assert r.status == 200
                assert decode(got, family_of(path), r.headers["Content-Type"]).content == SPLIT_TEXT  # client untouched
                tail = SPLIT_TEXT[SPLIT_TEXT.index(SPLIT_SECRET) + at :]
                assert f'"{tail}"'.encode() in got  # the stack really streamed the secret in two pieces
                sent += 1
    token = Masker([BUILTIN["email"]], load_key(p_llama.data)).token(SPLIT_SECRET)
    for p, n in ((p_llama, 3 * (len(SPLIT_SECRET) - 1)), (p_ollama, len(SPLIT_SECRET) - 1)):
        recs = p.wait_records(n)
        assert len(recs) == n
        raw = b"".join(f.read_bytes() for f in (p.data / "segments").iterdir())
        assert SPLIT_SECRET.encode() not in raw
        for rec in recs:
            content_type = next(v for k, v in rec["response_headers"] if k.lower() == "content-type")
            stored = decode(rec["response_body"].encode(), family_of(rec["path"]), content_type)
            expected = SPLIT_TEXT.replace(
                SPLIT_SECRET, Masker([BUILTIN["email"]], load_key(p.data)).token(SPLIT_SECRET)
            )
            assert stored.content == expected, (rec["path"], rec["response_body"])
            assert rec["extra"]["masked"]["email"] >= 1
    assert token.startswith("masked:") and sent == 4 * (len(SPLIT_SECRET) - 1)


async def test_bodies_spilled_to_a_file_are_masked_too(fake_stack, proxy):
    """Bodies above --spill-above pass through a temporary file; they are read back to be masked
    (and to be sampled) rather than written unmasked or dropped."""
    fake = fake_stack("llamacpp", responder=lambda req: text(f"ok {SECRET} " + "x" * 4000))
    p = proxy(
        fake.url,
        "--quiet",
        "--no-fingerprint",
        "--durability",
        "sync",
        "--mask",
        "email",
        "--spill-above",
        "1024",
        "--sample",
        "1",
    )
    body = {"model": fake.model, "messages": [{"role": "user", "content": f"mail {SECRET} " + "y" * 6000}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json=body) as r:
            got = await r.read()
    assert r.status == 200 and SECRET.encode() in got
    (rec,) = p.wait_records(1)
    assert p.stats()["recording"]["dropped"] == 0
    raw = b"".join(f.read_bytes() for f in (p.data / "segments").iterdir())
    assert SECRET.encode() not in raw and rec["extra"]["masked"] == {"email": 2}
    assert rec["extra"]["sample"] == {"rate": 1.0, "by": "opening"}
    assert json.loads(rec["request_body"])["messages"][0]["content"].startswith("mail masked:")


@pytest.mark.parametrize("depth", [10, 300, 1000])
def test_deeply_nested_json_is_masked(depth):
    deep = "[" * depth + '"a@example.com"' + "]" * depth
    for body in (deep, f"data: {deep}\n\ndata: [DONE]\n\n"):
        hits: Counter = Counter()
        out = M.body(body, hits)
        assert hits["email"] == 1 and "a@example.com" not in out and M.token("a@example.com") in out
