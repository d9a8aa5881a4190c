"""The llama-cpp-python emulator answers as the real server did (tests/data/llamacpp_python/,
captured from `python -m llama_cpp.server` with Qwen2.5-Coder-0.5B), and the fingerprint knows both."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest

from toolproxy.emulators import FakeStack, call
from toolproxy.stacks import catalog
from toolproxy.stacks.fingerprint import GET_PROBES, Observed, identify, probe

DATA = Path(__file__).parent / "data" / "llamacpp_python"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "What is 3*7? Use the calculator."}]
NAMED = {"type": "function", "function": {"name": "calculator"}}


def _real(name: str):
    return json.loads((DATA / name).read_text())


def _shape(obj):
    """Keys in order, recursively, with the type of every leaf: what a client's parser meets."""
    if isinstance(obj, dict):
        return [(k, _shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [_shape(v) for v in obj[:1]]
    return type(obj).__name__


@pytest.fixture(scope="module")
def fake():
    stack = FakeStack("llama-cpp-python", responder=lambda req: call("calculator", {"expression": "3*7"}))
    with stack.in_thread():
        yield stack


async def _post(fake, body, raw=False):
    async with aiohttp.ClientSession() as s:
        async with s.post(fake.url + "/v1/chat/completions", json=body) as r:
            return r.status, r.headers, (await r.read() if raw else await r.json(content_type=None))


async def test_tools_without_a_named_choice_are_dropped_and_the_call_stays_in_content(fake):
    status, headers, body = await _post(fake, {"model": "qwen2.5-coder-0.5b", "messages": ASK, "tools": TOOLS})
    real = _real("chat_tools_auto.json")
    assert status == 200 and headers["Server"] == "uvicorn"
    assert _shape(body) == _shape(real)  # no tool_calls, no timings, the content first in the message
    assert json.loads(body["choices"][0]["message"]["content"]) == json.loads(real["choices"][0]["message"]["content"])
    assert body["model"] == real["model"] == "qwen2.5-coder-0.5b"  # the name asked for, not the file it loaded


async def test_a_named_tool_choice_forces_that_call(fake):
    _, _, body = await _post(
        fake, {"model": "qwen2.5-coder-0.5b", "messages": ASK, "tools": TOOLS, "tool_choice": NAMED}
    )
    real = _real("chat_tool_named.json")
    assert _shape(body) == _shape(real)
    for reply in (body, real):
        msg = reply["choices"][0]["message"]
        assert re.fullmatch(r"call__0_calculator_cmpl-[0-9a-f-]{36}", msg["tool_calls"][0]["id"])
        assert msg["function_call"] == msg["tool_calls"][0]["function"] and msg["content"] is None
        assert json.loads(msg["function_call"]["arguments"]) == {"expression": "3*7"}
        assert reply["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_stream_is_sse_in_pythons_json_spacing(fake):
    status, headers, raw = await _post(
        fake, {"model": "qwen2.5-coder-0.5b", "messages": ASK, "tools": TOOLS, "stream": True}, raw=True
    )
    real = (DATA / "chat_tools_stream.sse").read_bytes()
    assert status == 200 and headers["Content-Type"] == "text/event-stream; charset=utf-8"
    for events in (raw, real):
        chunks = [e.removeprefix(b"data: ") for e in events.split(b"\n\n") if e]
        assert chunks[-1] == b"[DONE]"
        first, last = json.loads(chunks[0]), json.loads(chunks[-2])
        assert list(first) == ["id", "model", "created", "object", "choices"]
        assert first["choices"][0]["delta"] == {"role": "assistant"} and last["choices"][0]["delta"] == {}
        assert chunks[0].startswith(b'{"id": "chatcmpl-')  # json.dumps spacing, not compact
    assert _shape(json.loads(raw.split(b"\n\n")[1][6:])) == _shape(json.loads(real.split(b"\n\n")[1][6:]))


async def test_a_request_that_fails_validation_is_a_500(fake):
    status, _, body = await _post(fake, {"model": "m", "messages": "nope"})
    real = _real("validation_error.json")
    assert status == 500 and _shape(body) == _shape(real)
    for reply in (body, real):
        assert reply["error"]["message"].startswith(
            "1 validation error:\n  {'type': 'list_type', 'loc': ('body', 'messages')"
        )
        assert reply["error"]["type"] == "internal_server_error"


async def test_the_fingerprint_names_it_from_the_real_servers_answers_and_the_emulators(fake):
    real = {p: Observed(404, b'{"detail":"Not Found"}', {"server": "uvicorn"}) for p in GET_PROBES}
    real["GET /openapi.json"] = Observed(200, (DATA / "openapi.json").read_bytes(), {"server": "uvicorn"})
    real["GET /v1/models"] = Observed(200, (DATA / "models.json").read_bytes(), {"server": "uvicorn"})
    fp = identify("http://127.0.0.1:18433", real, "qwen2.5-coder-0.5b")
    assert (fp.stack, fp.version) == ("llama-cpp-python", _real("openapi.json")["info"]["version"])
    assert fp.details["model_path"].endswith("qwen2.5-coder-0.5b.gguf") and fp.model_listed is None
    async with aiohttp.ClientSession() as s:
        emulated = await probe(s, fake.url, "qwen2.5-coder-0.5b")
    assert (emulated.stack, emulated.version) == (fp.stack, catalog.LLAMACPP_PYTHON.version)
    assert emulated.evidence == fp.evidence == [catalog.LLAMACPP_PYTHON.probes[0].evidence]
