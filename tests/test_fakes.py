"""The fakes answer as the real stacks do (bytes, status, Content-Type, framing)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from toolproxy.emulators import (
    FakeStack,
    broken_call,
    call,
    close_mid_stream,
    gzipped,
    raw,
    stall,
    text,
    text_call,
)

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
MSGS = [{"role": "user", "content": "Weather in Paris?"}]
DATA = Path(__file__).parent / "data"


async def post(url: str, path: str, body: dict) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(url + path, json=body) as r:
            return r.status, r.headers.get("Content-Type", ""), await r.read()


# stack, options, path, model, send tools?, status, Content-Type, exact body
REFUSALS = [
    (
        "ollama",
        {},
        "/v1/chat/completions",
        "gemma3",
        True,
        400,
        "application/json",
        b'{"error":{"message":"registry.ollama.ai/library/gemma3:latest does not support tools",'
        b'"type":"invalid_request_error","param":null,"code":null}}\n',
    ),
    (
        "ollama",
        {},
        "/api/chat",
        "gemma3",
        True,
        400,
        "application/json; charset=utf-8",
        b'{"error":"registry.ollama.ai/library/gemma3:latest does not support tools"}',
    ),
    (
        "ollama",
        {},
        "/api/chat",
        "nope:1b",
        False,
        404,
        "application/json; charset=utf-8",
        b'{"error":"model \\"nope:1b\\" not found, try pulling it first"}',
    ),
    (
        "ollama",
        {},
        "/v1/chat/completions",
        "nope:1b",
        False,
        404,
        "application/json",
        b'{"error":{"message":"model \\"nope:1b\\" not found, try pulling it first","type":"not_found_error",'
        b'"param":null,"code":null}}\n',
    ),
    (
        "vllm",
        {},
        "/v1/chat/completions",
        "Qwen/Qwen2.5-7B-Instruct",
        True,
        400,
        "application/json",
        b'{"error":{"message":"\\"auto\\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
        b'set",'
        b'"type":"BadRequestError","param":null,"code":400}}',
    ),
    (
        "llamacpp",
        {"jinja": False},
        "/v1/chat/completions",
        "m",
        True,
        500,
        "application/json; charset=utf-8",
        b'{"error":{"code":500,"message":"tools param requires --jinja flag","type":"server_error"}}',
    ),
]


@pytest.mark.parametrize("stack,opts,path,model,tools,status,ctype,body", REFUSALS)
async def test_refusals_byte_exact(stack, opts, path, model, tools, status, ctype, body):
    req = {"model": model, "messages": MSGS, "stream": False}
    if tools:
        req["tools"] = TOOLS
    async with FakeStack(stack, **opts).running() as url:
        got = await post(url, path, req)
    assert got == (status, ctype, body)


async def test_no_jinja_refuses_streaming_requests_with_plain_json():
    async with FakeStack("no_jinja").running() as url:
        status, ctype, body = await post(
            url, "/v1/chat/completions", {"model": "m", "messages": MSGS, "tools": TOOLS, "stream": True}
        )
    assert (status, ctype) == (500, "application/json; charset=utf-8")
    assert json.loads(body)["error"]["message"] == "tools param requires --jinja flag"


@pytest.mark.parametrize(
    "stack,opts,model,native,in_content",
    [
        ("vllm", {"tool_parser": "hermes"}, "Qwen/Qwen2.5-7B-Instruct", True, None),
        ("sglang", {}, "Qwen/Qwen2.5-7B-Instruct", False, "<tool_call>"),
        ("sglang", {"tool_parser": "qwen25"}, "Qwen/Qwen2.5-7B-Instruct", True, None),
        ("llamacpp", {}, "m", True, None),
        ("lmstudio", {}, "google/gemma-3-4b", False, "[TOOL_REQUEST]"),
        ("lmstudio", {}, "qwen2.5-7b-instruct", True, None),
        ("openai", {}, "gpt-4o-mini", True, None),
        ("ollama", {}, "qwen2.5:7b", True, None),
    ],
)
async def test_a_call_is_native_or_text_depending_on_the_stack(stack, opts, model, native, in_content):
    fake = FakeStack(stack, **opts).enqueue(call("get_weather", {"city": "Paris"}))
    async with fake.running() as url:
        status, _, body = await post(url, "/v1/chat/completions", {"model": model, "messages": MSGS, "tools": TOOLS})
    assert status == 200
    choice = json.loads(body)["choices"][0]
    if native:
        tc = choice["message"]["tool_calls"]
        assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in tc] == [
            ("get_weather", {"city": "Paris"})
        ]
        assert choice["finish_reason"] == "tool_calls"
    else:
        assert in_content in choice["message"]["content"]
        assert not choice["message"].get("tool_calls")
        assert choice["finish_reason"] == "stop"


async def test_ollama_drops_calls_to_tools_not_offered_and_reencodes_numbers():
    fake = FakeStack("ollama").enqueue(
        call("launch_rocket", {"n": 1}), call("get_weather", {"city": "Paris", "days": 3.0})
    )
    async with fake.running() as url:
        _, _, dropped = await post(
            url, "/v1/chat/completions", {"model": "qwen2.5:7b", "messages": MSGS, "tools": TOOLS}
        )
        _, _, kept = await post(
            url, "/api/chat", {"model": "qwen2.5:7b", "messages": MSGS, "tools": TOOLS, "stream": False}
        )
    choice = json.loads(dropped)["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": ""} and choice["finish_reason"] == "stop"
    assert b'"arguments":{"city":"Paris","days":3}' in kept


async def test_ollama_native_chat_streams_ndjson_with_object_arguments():
    fake = FakeStack("ollama").enqueue(call("get_weather", {"city": "Paris"}))
    async with fake.running() as url:
        status, ctype, body = await post(url, "/api/chat", {"model": "qwen2.5:7b", "messages": MSGS, "tools": TOOLS})
    assert (status, ctype) == (200, "application/x-ndjson")
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert lines[0]["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert body.endswith(b"}\n")


async def test_ollama_go_json_escapes_html_characters():
    fake = FakeStack("ollama").enqueue(text_call("hermes", "get_weather", {"city": "Paris"}))
    async with fake.running() as url:
        _, _, body = await post(url, "/v1/chat/completions", {"model": "qwen2.5:7b", "messages": MSGS})
    assert b"\\u003ctool_call\\u003e" in body
    assert json.loads(body)["choices"][0]["message"]["content"].startswith("<tool_call>")


async def test_openai_stream_has_argument_fragments_and_a_usage_chunk():
    fake = FakeStack("openai").enqueue(call("get_weather", {"city": "Paris"}))
    async with fake.running() as url:
        status, ctype, body = await post(
            url,
            "/v1/chat/completions",
            {
                "model": "gpt-4o-mini",
                "messages": MSGS,
                "tools": TOOLS,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert (status, ctype) == (200, "text/event-stream; charset=utf-8")
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [json.loads(e[6:]) for e in events[:-2]]
    frags = [
        c["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments")
        for c in chunks
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert len(frags) >= 3 and "".join(frags) == '{"city":"Paris"}'
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


@pytest.mark.parametrize(
    "stack,path,needle",
    [
        ("ollama", "/api/version", b'{"version":'),
        ("ollama", "/api/tags", b'"models":'),
        ("ollama", "/", b"Ollama is running"),
        ("ollama", "/v1/models", b'"owned_by":"library"'),
        ("vllm", "/version", b'{"version":'),
        ("vllm", "/v1/models", b'"owned_by":"vllm","root"'),
        ("vllm", "/v1/models", b'"max_model_len":32768'),
        ("sglang", "/get_model_info", b'"weight_version":"default"'),
        ("sglang", "/server_info", b'"tool_call_parser":null'),
        ("sglang", "/v1/models", b'"owned_by":"sglang"'),
        ("llamacpp", "/props", b'"chat_template_caps":'),
        ("llamacpp", "/props", b'"build_info":'),
        ("llamacpp", "/health", b'{"status":"ok"}'),
        ("llamacpp", "/v1/models", b'"owned_by":"llamacpp"'),
        ("lmstudio", "/api/v1/models", b'"trained_for_tool_use": false'),
    ],
)
async def test_metadata_endpoints(stack, path, needle):
    async with FakeStack(stack).running() as url, aiohttp.ClientSession() as s:
        async with s.get(url + path) as r:
            assert r.status == 200
            assert needle in await r.read()


def _keys(obj) -> list:
    """Keys in order, recursively: the shape a client's reader meets."""
    return [(k, _keys(v)) for k, v in obj.items()] if isinstance(obj, dict) else []


@pytest.mark.parametrize("stack,capture", [("llamacpp", "props_jinja.json"), ("no_jinja", "props_no_jinja.json")])
async def test_llamacpp_props_reports_the_template_with_or_without_jinja(stack, capture):
    """The real server reports the GGUF's template and caps under --no-jinja too (tests/data/llamacpp)."""
    real = json.loads((DATA / "llamacpp" / capture).read_text())
    async with FakeStack(stack).running() as url:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/props") as r:
                props = await r.json()
    top = [k for k, _ in _keys(real)]
    assert [k for k, _ in _keys(props)] == top
    assert props["chat_template_caps"] == real["chat_template_caps"] and props["chat_template_caps"]["supports_tools"]
    assert props["chat_template"] and "tools" in props["chat_template"] and "tools" in real["chat_template"]


async def test_llamacpp_props_cannot_tell_no_jinja_apart_as_on_the_real_server():
    """The two real captures differ only in media_marker (random per start), and so do the emulator's."""
    real = [json.loads((DATA / "llamacpp" / f).read_text()) for f in ("props_jinja.json", "props_no_jinja.json")]
    emulated = []
    for stack in ("llamacpp", "no_jinja"):
        async with FakeStack(stack).running() as url:
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/props") as r:
                    emulated.append(await r.json())
    for jinja, no_jinja in (real, emulated):
        assert jinja["media_marker"] != no_jinja["media_marker"]
        assert {**jinja, "media_marker": ""} == {**no_jinja, "media_marker": ""}


async def test_ollama_show_reports_capabilities_and_template():
    async with FakeStack("ollama").running() as url:
        status, _, body = await post(url, "/api/show", {"model": "qwen2.5:7b"})
        missing = await post(url, "/api/show", {"model": "nope"})
    show = json.loads(body)
    assert status == 200 and show["capabilities"] == ["completion", "tools"] and ".Tools" in show["template"]
    assert missing[0] == 404 and json.loads(missing[2]) == {"error": "model 'nope' not found"}


async def test_llamacpp_parse_failure_is_a_500():
    fake = FakeStack("llamacpp").enqueue(broken_call('<tool_call>{"name": "get_weather", "arguments": {"city": '))
    async with fake.running() as url:
        status, _, body = await post(url, "/v1/chat/completions", {"model": "m", "messages": MSGS, "tools": TOOLS})
    err = json.loads(body)["error"]
    assert (
        status == 500
        and err["type"] == "server_error"
        and err["message"].startswith("Failed to parse input at pos 0: ")
    )


async def test_vllm_honours_response_format_and_ignores_guided_json():
    seen = []
    fake = FakeStack("vllm", tool_parser="hermes", responder=lambda r: seen.append(r.constraint) or text("{}"))
    schema = {"type": "object"}
    async with fake.running() as url:
        await post(url, "/v1/chat/completions", {"model": fake.model, "messages": MSGS, "guided_json": schema})
        await post(
            url,
            "/v1/chat/completions",
            {
                "model": fake.model,
                "messages": MSGS,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            },
        )
    assert seen == [None, schema]


async def test_a_script_of_replies_then_the_default():
    fake = FakeStack("openai").enqueue(*([call("get_weather", {"city": "Paris"})] * 2), text("no"))
    results = []
    async with fake.running() as url:
        for _ in range(4):
            _, _, body = await post(
                url, "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": MSGS, "tools": TOOLS}
            )
            results.append(json.loads(body)["choices"][0]["finish_reason"])
    assert results == ["tool_calls", "tool_calls", "stop", "stop"]


async def test_faults():
    fake = FakeStack("vllm", tool_parser="hermes")
    body = {"model": fake.model, "messages": MSGS, "stream": True}
    async with fake.running() as url, aiohttp.ClientSession(auto_decompress=False) as s:
        fake.inject(close_mid_stream(after=1))
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
        fake.inject(gzipped())
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(await r.read()).endswith(b"data: [DONE]\n\n")
        fake.inject(raw(b"\xff\xfe not json", status=502, content_type="text/plain"))
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            assert (r.status, await r.read()) == (502, b"\xff\xfe not json")
        fake.fail(2, 500, "CUDA out of memory")
        statuses = []
        for _ in range(3):
            async with s.post(url + "/v1/chat/completions", json={**body, "stream": False}) as r:
                statuses.append(r.status)
        assert statuses == [500, 500, 200]
        fake.inject(stall(between=5))
        with pytest.raises(aiohttp.ClientError):
            async with s.post(
                url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(sock_read=0.2)
            ) as r:
                await r.read()
    assert [x.outcome for x in fake.seen] == [
        "cut",
        "complete",
        "complete",
        "complete",
        "complete",
        "complete",
        "disconnected",
    ]
    assert fake.disconnected.is_set()


def test_openai_sdk_against_a_threaded_fake(fake_stack):
    fake = fake_stack("vllm", tool_parser="hermes")
    fake.enqueue(call("get_weather", {"city": "Paris"}))
    client = openai.OpenAI(base_url=fake.url + "/v1", api_key="x")
    r = client.chat.completions.create(model=fake.model, messages=MSGS, tools=TOOLS)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert fake.seen[-1].json()["tools"] == TOOLS


def test_every_name_the_package_lists_imports_with_a_star():
    """`from toolproxy.emulators import *` in a fresh interpreter: one name in __all__ that no
    longer exists fails the whole import."""
    import toolproxy.emulators as package

    done = subprocess.run(
        [sys.executable, "-c", "from toolproxy.emulators import *; print(*sorted(dir()))"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert set(package.__all__) <= set(done.stdout.split())


def test_command_line_prints_its_url():
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolproxy.emulators", "sglang", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("fake sglang listening on http://127.0.0.1:")
    finally:
        proc.terminate()
        proc.wait(5)


def test_the_command_logs_a_request_its_parser_refuses_as_one_redacted_line():
    """`python -m toolproxy.emulators --host ...` can be reached by others: a request aiohttp's
    parser refuses was a traceback on stderr quoting the key it carried, as under playback."""
    import re
    import socket

    proc = subprocess.Popen(
        [sys.executable, "-m", "toolproxy.emulators", "llamacpp", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(re.search(r":(\d+)", proc.stdout.readline().rsplit("/", 1)[-1]).group(1))
        for raw in (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-SECRET-1\x01\r\n\r\n",
            b"GET /v1/models?api_key=sk-SECRET-2\x1b HTTP/1.1\r\nHost: x\r\n\r\n",
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(raw)
                assert s.recv(65536).startswith(b"HTTP/1.0 400")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err and "SECRET" not in err and "\x1b" not in err and "\x01" not in err, err
    assert err.count("refused a malformed request") == 2, err


def test_proxy_fixture_forwards_and_records(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet")
    client = openai.OpenAI(base_url=p.url + "/t/run=smoke/v1", api_key="sk-test")
    r = client.chat.completions.create(model="gpt-4o-mini", messages=MSGS)
    assert r.choices[0].message.content == "Hello! How can I help you today?"
    recs = p.wait_records(1)
    assert len(recs) == 1 and recs[0]["run"] == "smoke" and recs[0]["status"] == 200
