"""Pass-through: what the client gets is byte for byte what the upstream sent, and it is recorded."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import aiohttp
import openai
import pytest

from toolproxy.emulators import call, text, text_call
from toolproxy.record.model import body_bytes
from toolproxy.wire.hopbyhop import HOP_BY_HOP

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
MSGS = [{"role": "user", "content": "Weather in Paris? <b>&amp; ünïcödé</b>"}]

# stack, fake options, path, request body (model filled in), expected upstream status
CASES = [
    ("openai", {}, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS}, 200),
    (
        "openai",
        {},
        "/v1/chat/completions",
        {"messages": MSGS, "tools": TOOLS, "stream": True, "stream_options": {"include_usage": True}},
        200,
    ),
    (
        "vllm",
        {"tool_parser": "hermes"},
        "/v1/chat/completions",
        {"messages": MSGS, "tools": TOOLS, "stream": True},
        200,
    ),
    ("vllm", {}, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS}, 400),
    ("vllm", {}, "/v1/completions", {"prompt": "Hello", "stream": True}, 200),
    ("sglang", {}, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS}, 200),
    ("llamacpp", {}, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS, "stream": True}, 200),
    ("llamacpp", {"jinja": False}, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS, "stream": True}, 500),
    ("llamacpp", {}, "/completion", {"prompt": "Hello", "stream": True}, 200),
    ("ollama", {}, "/api/chat", {"messages": MSGS, "tools": TOOLS}, 200),
    ("ollama", {}, "/api/generate", {"prompt": "Hello", "raw": True, "stream": False}, 200),
    ("ollama", {}, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS, "stream": True}, 200),
    (
        "ollama",
        {"models": {"gemma3:latest": ("completion",)}},
        "/v1/chat/completions",
        {"messages": MSGS, "tools": TOOLS},
        400,
    ),
    ("ollama", {"models": {"gemma3:latest": ("completion",)}}, "/api/chat", {"messages": MSGS, "tools": TOOLS}, 400),
    ("lmstudio", {}, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS}, 200),
]


def _visible(headers) -> list[tuple[str, str]]:
    """End-to-end headers as a comparable multiset (hop-by-hop ones are the proxy's own business)."""
    return sorted((k.lower(), v) for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() != "content-length")


@pytest.mark.parametrize("stack,opts,path,body,status", CASES, ids=[f"{c[0]}{c[2]}-{c[4]}" for c in CASES])
async def test_byte_identical_pass_through(served, stack, opts, path, body, status):
    fake, p = served(stack, "--quiet", **opts)
    fake.enqueue(call("get_weather", {"city": "Paris", "days": 3.0}))
    sent = json.dumps({"model": fake.model, **body}).encode()
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(p.url + path, data=sent, headers={"Content-Type": "application/json"}) as r:
            got = await r.read()
            got_status, got_headers = r.status, list(r.headers.items())
    upstream = fake.seen[-1]
    assert got_status == status == upstream.status
    assert got == upstream.sent and got  # the client got exactly the upstream's bytes
    assert upstream.body == sent  # and the upstream got exactly the client's
    (rec,) = p.wait_records(1)
    assert rec["status"] == status and rec["error_kind"] is None and rec["response_complete"] is True
    assert body_bytes(rec["response_body"], rec["response_body_encoding"]) == got
    assert body_bytes(rec["request_body"], rec["request_body_encoding"]) == sent
    assert rec["path"] == path and rec["method"] == "POST"
    assert _visible(got_headers) == _visible(rec["response_headers"])
    assert dict(got_headers)["Content-Type"] == rec_header(rec, "Content-Type")


def rec_header(rec: dict, name: str) -> str | None:
    return next((v for k, v in rec["response_headers"] if k.lower() == name.lower()), None)


async def test_stream_chunks_reach_the_client_before_the_upstream_finishes(served):
    """Never buffered whole: the first event arrives while the upstream is still stalling."""
    from toolproxy.emulators import stall

    fake, p = served("openai", "--quiet")
    fake.enqueue(text("one two"))
    fake.inject(stall(between=0.15))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="sk-x")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    stream = await client.chat.completions.create(model="gpt-4o-mini", messages=MSGS, stream=True)
    first_at = None
    parts = []
    async for chunk in stream:
        if first_at is None:
            first_at = loop.time() - t0
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    total = loop.time() - t0
    assert "".join(parts) == "one two"
    assert total > 0.55 and first_at < total - 0.4  # 4 stalls of 0.15 s follow the first event


def test_request_headers_pass_through_and_hop_by_hop_ones_do_not(fake_stack, proxy):
    import http.client
    from urllib.parse import urlsplit

    fake = fake_stack("vllm")
    p = proxy(fake.url, "--quiet")
    u = urlsplit(p.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.request(
        "GET",
        "/v1/models?x=1",
        headers={
            "X-Custom": "kept",
            "User-Agent": "harness/1.0",
            "Accept": "application/json",
            "Connection": "keep-alive, X-Drop-Me",
            "X-Drop-Me": "hop",
            "Keep-Alive": "timeout=5",
            "TE": "trailers",
            "OpenAI-Organization": "org-1",
        },
    )
    r = conn.getresponse()
    assert r.status == 200 and b'"owned_by":"vllm"' in r.read()
    conn.close()
    seen = fake.seen[-1]
    assert seen.path == "/v1/models" and seen.query == "x=1"
    h = {k.lower(): v for k, v in seen.header_list}
    assert h["x-custom"] == "kept" and h["user-agent"] == "harness/1.0" and h["accept"] == "application/json"
    assert h["openai-organization"] == "org-1"
    assert "x-drop-me" not in h and "keep-alive" not in h and "te" not in h
    assert h["host"] == fake.url.split("//")[1]  # the upstream's own authority, not the proxy's


def test_path_and_header_tags_are_parsed_stripped_and_never_forwarded(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--run", "default-run")
    client = openai.OpenAI(
        base_url=p.url + "/t/run=qwen-native/episode=3/item=bfcl_12/category=simple/v1", api_key="sk-x"
    )
    client.chat.completions.create(model="gpt-4o-mini", messages=MSGS)
    plain = openai.OpenAI(
        base_url=p.url + "/v1",
        api_key="sk-x",
        default_headers={
            "X-Toolproxy-Run": "hdr-run",
            "X-Toolproxy-Episode": "7",
            "X-Toolproxy-Item": "it-9",
            "X-Toolproxy-Tag-Split": "dev",
        },
    )
    plain.chat.completions.create(model="gpt-4o-mini", messages=MSGS)
    openai.OpenAI(base_url=p.url + "/v1", api_key="sk-x").models.list()
    assert [s.path for s in fake.seen] == ["/v1/chat/completions", "/v1/chat/completions", "/v1/models"]
    for s in fake.seen:
        assert not [k for k, _ in s.header_list if k.lower().startswith("x-toolproxy")]
    a, b, c = p.wait_records(3)
    assert (a["run"], a["episode"], a["item"], a["tags"]) == ("qwen-native", "3", "bfcl_12", {"category": "simple"})
    assert a["path"] == "/v1/chat/completions" and a["client_path"].startswith("/t/run=qwen-native/")
    assert (b["run"], b["episode"], b["item"], b["tags"]) == ("hdr-run", "7", "it-9", {"split": "dev"})
    assert (c["run"], c["episode"]) == ("default-run", None)


def test_a_run_pattern_names_each_untagged_request_by_its_utc_start(fake_stack, proxy):
    """`--run prod-%Y-%m-%d`: a run a day for traffic nobody tags, in UTC whatever the host's zone
    (+05:45 here, so local hours and minutes never equal UTC's); a run tag still wins."""
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--run", "prod-%Y-%m-%d-%H%M%%", env={"TZ": "Asia/Kathmandu"})
    openai.OpenAI(base_url=p.url + "/v1", api_key="sk-x").chat.completions.create(model="gpt-4o-mini", messages=MSGS)
    openai.OpenAI(base_url=p.url + "/t/run=tagged/v1", api_key="sk-x").chat.completions.create(
        model="gpt-4o-mini", messages=MSGS
    )
    by_tag = {r["run"] == "tagged": r for r in p.wait_records(2)}
    untagged, tagged = by_tag[False], by_tag[True]
    started = time.gmtime(untagged["started_at"])
    assert untagged["run"] == time.strftime("prod-%Y-%m-%d-%H%M", started) + "%"
    assert tagged["run"] == "tagged"


def test_openai_sdk_sync_with_tools_through_the_proxy(served):
    fake, p = served("vllm", "--quiet", tool_parser="hermes")
    fake.enqueue(call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Rome"}))
    client = openai.OpenAI(base_url=p.url + "/v1", api_key="sk-x")
    r = client.chat.completions.create(model=fake.model, messages=MSGS, tools=TOOLS)
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
    stream = client.chat.completions.create(model=fake.model, messages=MSGS, tools=TOOLS, stream=True)
    args = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in stream
        if c.choices and c.choices[0].delta.tool_calls
    )
    assert json.loads(args) == {"city": "Rome"}
    recs = p.wait_records(2)
    assert [r["status"] for r in recs] == [200, 200]
    assert "data: [DONE]" in recs[1]["response_body"]


async def test_openai_sdk_async_stream_and_refusals(served):
    ollama, p = served(
        "ollama", "--quiet", models={"qwen2.5:7b": ("completion", "tools"), "gemma3:latest": ("completion",)}
    )
    ollama.enqueue(call("get_weather", {"city": "Paris"}))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="ollama", max_retries=0)
    stream = await client.chat.completions.create(model="qwen2.5:7b", messages=MSGS, tools=TOOLS, stream=True)
    calls = [
        c.choices[0].delta.tool_calls for c in [c async for c in stream] if c.choices and c.choices[0].delta.tool_calls
    ]
    assert calls[0][0].function.name == "get_weather"
    with pytest.raises(openai.BadRequestError) as exc:
        await client.chat.completions.create(model="gemma3", messages=MSGS, tools=TOOLS)
    assert exc.value.status_code == 400
    assert exc.value.body["message"] == "registry.ollama.ai/library/gemma3:latest does not support tools"
    recs = p.wait_records(2)
    assert [r["status"] for r in recs] == [200, 400]
    assert recs[1]["response_body"] == (
        '{"error":{"message":"registry.ollama.ai/library/gemma3:latest does not support '
        'tools","type":"invalid_request_error","param":null,"code":null}}\n'
    )


async def test_concurrent_exchanges_each_get_their_own_record(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    fake.responder = lambda req: text("echo " + req.messages[-1]["content"])
    p = proxy(fake.url, "--quiet")
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x")

    async def one(i: int) -> str:
        r = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"n{i}"}], stream=bool(i % 2)
        )
        if i % 2:
            return "".join([c.choices[0].delta.content or "" async for c in r if c.choices])
        return r.choices[0].message.content

    out = await asyncio.gather(*(one(i) for i in range(40)))
    assert out == [f"echo n{i}" for i in range(40)]
    recs = p.wait_records(40)
    assert len(recs) == 40 and len({r["id"] for r in recs}) == 40
    assert sorted(json.loads(r["request_body"])["messages"][0]["content"] for r in recs) == sorted(
        f"n{i}" for i in range(40)
    )


def test_text_call_and_reasoning_pass_untouched(served):
    fake, p = served("sglang", "--quiet")
    fake.enqueue(text_call("fenced", "get_weather", {"city": "Paris"}, before="Sure:\n"))
    r = openai.OpenAI(base_url=p.url + "/v1", api_key="x").chat.completions.create(
        model=fake.model, messages=MSGS, tools=TOOLS
    )
    assert r.choices[0].message.content.startswith('Sure:\n```json\n{"name": "get_weather"')
    assert r.choices[0].message.tool_calls is None


def test_compressed_request_bodies_are_forwarded_and_recorded_as_sent(fake_stack, proxy):
    """Found by the fuzz suite: aiohttp inflated request bodies, so a gzip body was recorded
    inflated and one that was not really deflate answered 500 proxy_error."""
    import gzip
    import http.client
    from urllib.parse import urlsplit

    from toolproxy.record.model import body_bytes

    fake = fake_stack("vllm")
    p = proxy(fake.url, "--quiet")
    u = urlsplit(p.url)
    sent = [(gzip.compress(b'{"model": "m", "messages": []}'), "gzip"), (b"not deflate at all", "deflate")]
    statuses = []
    for body, encoding in sent:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
        )
        r = conn.getresponse()
        r.read()
        statuses.append(r.status)
        conn.close()
    recs = p.wait_records(2)
    assert [body_bytes(r["request_body"], r["request_body_encoding"]) for r in recs] == [b for b, _ in sent]
    assert fake.seen[0].body == b'{"model": "m", "messages": []}'  # the fake (aiohttp) inflates what it was sent
    # whatever the upstream made of the bodies, the proxy itself did not fail
    assert [(r["error_kind"], r["status"]) for r in recs] == [(None, s) for s in statuses]


def test_a_v1_on_the_wrong_side_of_the_tags_is_put_right(fake_stack, proxy):
    """Base URLs end in /v1, so harnesses put one before the tags or add a second after them: where
    only one path can be meant it is forwarded there and the run keeps its tags."""
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet")
    for base in (
        p.url + "/v1/t/run=before/item=q1",  # the proxy's address with /v1, then the tags
        p.url + "/v1/t/run=both/v1",
    ):  # react_agent.py --proxy http://HOST/v1 once did this
        openai.OpenAI(base_url=base, api_key="sk-x").chat.completions.create(model="gpt-4o-mini", messages=MSGS)
    openai.OpenAI(base_url=p.url + "/v1/t/run=models", api_key="sk-x").models.list()
    doubled = json.dumps({"model": "gpt-4o-mini", "messages": MSGS}).encode()  # a client that appends /v1/... itself
    req = urllib.request.Request(
        p.url + "/t/run=doubled/v1/v1/chat/completions", data=doubled, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
    assert [s.path for s in fake.seen] == [
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/chat/completions",
    ]
    recs = p.wait_records(4)
    assert [(r["run"], r["item"], r["path"], r["status"]) for r in recs] == [
        ("before", "q1", "/v1/chat/completions", 200),
        ("both", None, "/v1/chat/completions", 200),
        ("models", None, "/v1/models", 200),
        ("doubled", None, "/v1/chat/completions", 200),
    ]
    assert recs[1]["client_path"] == "/v1/t/run=both/v1/chat/completions"  # the record keeps what was asked


@pytest.mark.parametrize(
    "path, error_of",
    [
        ("/v1/t/run=x/completion", lambda doc: doc["error"]["message"]),  # llama.cpp's own path, or a typo?
        ("/v1/t/run=x/ollama/api/chat", lambda doc: doc["error"]),  # Ollama's clients read a bare string
        ("/v1/t/run=x/anthropic/v1/messages", lambda doc: doc["type"] == "error" and doc["error"]["message"]),
    ],
)
def test_tags_after_a_v1_with_no_one_reading_get_a_404_naming_the_base_url(fake_stack, proxy, path, error_of):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet")
    req = urllib.request.Request(
        p.url + path, data=b'{"model": "m", "prompt": "hi"}', headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as got:
        urllib.request.urlopen(req, timeout=30)
    assert got.value.code == 404
    message = error_of(json.loads(got.value.read()))
    host = p.url.split("//")[1]
    assert (
        f"the tags go right after the proxy's address, before /v1: use the base URL http://{host}/t/run=x/v1 "
        f"(OpenAI-style clients) or http://{host}/t/run=x (Ollama's); this request asked for {path}"
    ) == message
    assert fake.seen == []  # nothing went upstream
    (rec,) = p.wait_records(1)
    assert (rec["client_status"], rec["error_kind"], rec["run"]) == (404, "misplaced_tags", None)  # untagged
