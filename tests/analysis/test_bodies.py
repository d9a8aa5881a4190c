"""Recorded response bodies through analysis.classify.bodies and the wire decoders: one row per wire shape a real
stack produces."""

from __future__ import annotations

import base64
import gzip
import os

import orjson
import pytest

from toolproxy.analysis.classify.bodies import decode_body
from toolproxy.wire import decode, family_of


def sse(*events, done=True) -> bytes:
    out = b"".join(b"data: " + (e if isinstance(e, bytes) else orjson.dumps(e)) + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(delta=None, finish=None, **extra):
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice], **extra}


def tc(index=None, id=None, name=None, args=None):
    d = {"function": {}}
    if index is not None:
        d["index"] = index
    if id is not None:
        d["id"], d["type"] = id, "function"
    if name is not None:
        d["function"]["name"] = name
    if args is not None:
        d["function"]["arguments"] = args
    return d


ndjson = lambda *objs: b"".join(orjson.dumps(o) + b"\n" for o in objs)  # noqa: E731

CASES = [
    # (id, path, content_type, body, expected attributes)
    (
        "openai non-stream tool call",
        "/v1/chat/completions",
        "application/json",
        orjson.dumps(
            {
                "id": "x",
                "model": "gpt",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                                }
                            ],
                        },
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": {"prompt_tokens": 80, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 64}},
            }
        ),
        dict(
            streamed=False,
            complete=True,
            content=None,
            finish_reason="tool_calls",
            calls=[("get_weather", '{"city":"Paris"}')],
            prompt_tokens=80,
            completion_tokens=12,
            cached_tokens=64,
            model="gpt",
        ),
    ),
    (
        "vLLM SSE: name first, argument fragments, usage chunk",
        "/v1/chat/completions",
        "text/event-stream",
        sse(
            chunk({"role": "assistant", "content": ""}),
            chunk({"tool_calls": [tc(0, "chatcmpl-tool-1", "get_weather", "")]}),
            chunk({"tool_calls": [tc(0, args='{"city"')]}),
            chunk({"tool_calls": [tc(0, args=': "Par')]}),
            chunk({"tool_calls": [tc(0, args='is"}')]}),
            chunk({}, "tool_calls"),
            {"id": "c1", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}},
        ),
        dict(
            streamed=True,
            complete=True,
            finish_reason="tool_calls",
            calls=[("get_weather", '{"city": "Paris"}')],
            prompt_tokens=10,
            completion_tokens=5,
            content=None,
        ),
    ),
    (
        "parallel calls interleaved by index",
        "/v1/chat/completions",
        "text/event-stream",
        sse(
            chunk({"tool_calls": [tc(0, "a", "f", "")]}),
            chunk({"tool_calls": [tc(1, "b", "g", "")]}),
            chunk({"tool_calls": [tc(1, args='{"y":2}')]}),
            chunk({"tool_calls": [tc(0, args='{"x":1}')]}),
            chunk({}, "tool_calls"),
        ),
        dict(calls=[("f", '{"x":1}'), ("g", '{"y":2}')], finish_reason="tool_calls"),
    ),
    (
        "content and reasoning deltas",
        "/v1/chat/completions",
        "text/event-stream",
        sse(
            chunk({"role": "assistant", "reasoning_content": "think "}),
            chunk({"reasoning_content": "more"}),
            chunk({"content": "Hello "}),
            chunk({"content": "world"}),
            chunk({}, "stop"),
        ),
        dict(content="Hello world", reasoning_content="think more", finish_reason="stop", complete=True, calls=[]),
    ),
    (
        "`reasoning` field (newer vLLM) counts as reasoning",
        "/v1/chat/completions",
        "text/event-stream",
        sse(chunk({"reasoning": "hmm"}), chunk({"content": "ok"}, "stop")),
        dict(content="ok", reasoning_content="hmm"),
    ),
    (
        "stream cut short: no finish, no [DONE], torn last event",
        "/v1/chat/completions",
        "text/event-stream",
        sse(chunk({"role": "assistant", "content": "Hel"}), done=False) + b'data: {"id":"c1","choices":[{"ind',
        dict(complete=False, content="Hel", finish_reason=None, streamed=True),
    ),
    (
        "Ollama /v1 stream: whole call in one chunk, no index",
        "/v1/chat/completions",
        "text/event-stream",
        sse(
            chunk({"role": "assistant", "content": ""}, system_fingerprint="fp_ollama"),
            chunk(
                {
                    "tool_calls": [
                        {"id": "call_x", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
                    ]
                }
            ),
            chunk({}, "tool_calls"),
        ),
        dict(calls=[("add", '{"a":1}')], finish_reason="tool_calls"),
    ),
    (
        "Ollama /api/chat NDJSON with object arguments",
        "/api/chat",
        "application/x-ndjson",
        ndjson(
            {
                "model": "qwen3",
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
                },
                "done": False,
            },
            {
                "model": "qwen3",
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "stop",
                "prompt_eval_count": 33,
                "eval_count": 7,
            },
        ),
        dict(
            streamed=True,
            complete=True,
            calls=[("get_weather", {"city": "Oslo"})],
            finish_reason="stop",
            prompt_tokens=33,
            completion_tokens=7,
            model="qwen3",
        ),
    ),
    (
        "Ollama /api/chat non-stream with thinking",
        "/api/chat",
        "application/json; charset=utf-8",
        orjson.dumps(
            {
                "model": "qwen3",
                "message": {"role": "assistant", "content": "Hi", "thinking": "greet"},
                "done": True,
                "done_reason": "stop",
            }
        ),
        dict(streamed=False, content="Hi", reasoning_content="greet", complete=True),
    ),
    (
        "Ollama /api/generate NDJSON",
        "/api/generate",
        "application/x-ndjson",
        ndjson(
            {"model": "m", "response": "Hel", "done": False},
            {"model": "m", "response": "lo", "done": False},
            {"model": "m", "response": "", "done": True, "done_reason": "length"},
        ),
        dict(content="Hello", finish_reason="length", complete=True),
    ),
    (
        "Ollama /api/generate cut before done",
        "/api/generate",
        "application/x-ndjson",
        ndjson({"model": "m", "response": "Hel", "done": False}),
        dict(content="Hel", complete=False),
    ),
    (
        "/v1/completions text",
        "/v1/completions",
        "application/json",
        orjson.dumps({"choices": [{"index": 0, "text": "<tool_call>{}</tool_call>", "finish_reason": "stop"}]}),
        dict(content="<tool_call>{}</tool_call>", finish_reason="stop"),
    ),
    (
        "llama.cpp /completion JSON with timings",
        "/completion",
        "application/json",
        orjson.dumps(
            {
                "content": "hi there",
                "stop": True,
                "stop_type": "eos",
                "tokens_evaluated": 20,
                "tokens_predicted": 3,
                "timings": {"cache_n": 16, "prompt_n": 4},
            }
        ),
        dict(content="hi there", finish_reason="stop", prompt_tokens=20, completion_tokens=3, cached_tokens=16),
    ),
    (
        "llama.cpp /completion SSE hitting the limit",
        "/completion",
        "text/event-stream",
        sse(
            {"content": "a", "stop": False},
            {"content": "b", "stop": False},
            {"content": "", "stop": True, "stop_type": "limit"},
            done=False,
        ),
        dict(content="ab", finish_reason="length", complete=True),
    ),
    (
        "legacy function_call",
        "/v1/chat/completions",
        "application/json",
        orjson.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
                        "finish_reason": "function_call",
                    }
                ]
            }
        ),
        dict(calls=[("f", "{}")]),
    ),
    (
        "vLLM nested error body",
        "/v1/chat/completions",
        "application/json",
        orjson.dumps(
            {
                "error": {
                    "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        ),
        dict(
            error='"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            calls=[],
            content=None,
        ),
    ),
    (
        "SGLang / old vLLM flat error",
        "/v1/chat/completions",
        "application/json",
        orjson.dumps({"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400}),
        dict(error="bad"),
    ),
    (
        "Ollama native string error",
        "/api/chat",
        "application/json",
        orjson.dumps({"error": "registry.ollama.ai/library/gemma3:latest does not support tools"}),
        dict(error="registry.ollama.ai/library/gemma3:latest does not support tools"),
    ),
    (
        "Ollama error event mid-stream after 200",
        "/v1/chat/completions",
        "text/event-stream",
        sse(
            chunk({"role": "assistant", "content": ""}),
            {"error": {"message": "failed to parse JSON: unexpected end", "type": "api_error"}},
        ),
        dict(error="failed to parse JSON: unexpected end", content=None),
    ),
    (
        "FastAPI detail error",
        "/v1/chat/completions",
        "application/json",
        orjson.dumps({"detail": "Not Found"}),
        dict(error="Not Found"),
    ),
    (
        "empty choices",
        "/v1/chat/completions",
        "application/json",
        orjson.dumps({"id": "x", "choices": []}),
        dict(n_choices=0, content=None, calls=[]),
    ),
    ("empty body", "/v1/chat/completions", "application/json", b"", dict(empty_body=True)),
    (
        "HTML error page",
        "/v1/chat/completions",
        "text/html",
        b"<html>502 Bad Gateway</html>",
        dict(unreadable="set", raw_text="<html>502 Bad Gateway</html>"),
    ),
]


@pytest.mark.parametrize("path,ctype,body,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decode(path, ctype, body, want):
    r = decode(body, family_of(path), ctype)
    for key, value in want.items():
        if key == "calls":
            assert [(c.name, c.arguments) for c in r.tool_calls] == value
        elif value == "set":
            assert getattr(r, key)
        else:
            assert getattr(r, key) == value, key


def test_sniffs_sse_without_content_type():
    r = decode(sse(chunk({"content": "x"}, "stop")), "chat", None)
    assert r.streamed and r.content == "x"


ENDPOINTS = [
    ("/v1/chat/completions", "chat"),
    ("/chat/completions", "chat"),
    ("/api/chat", "ollama_chat"),
    ("/api/generate", "ollama_generate"),
    ("/v1/completions", "completion"),
    ("/completion", "completion"),
    ("/v1/responses", "responses"),
    ("/responses", "responses"),
    ("/v1/messages", "messages"),
    ("/anthropic/v1/messages", "messages"),
    ("/v1/threads/t1/messages", None),
    ("/v1/messages/count_tokens", None),
    ("/v1/models", None),
    ("/api/tags", None),
    ("/v1/embeddings", None),
]


@pytest.mark.parametrize("path,kind", ENDPOINTS)
def test_family_of(path, kind):
    assert family_of(path) == kind


def test_decode_gzip_and_base64():
    body = b'{"choices":[]}'
    text = base64.b64encode(gzip.compress(body)).decode()
    assert decode_body(text, "base64", "gzip") == (body, None)
    # A gzip stream cut short still yields what it holds.
    full = b"data: " + os.urandom(3000).hex().encode()
    cut = gzip.compress(full)[:-200]
    raw, problem = decode_body(base64.b64encode(cut).decode(), "base64", "gzip")
    assert problem is None and 1000 < len(raw) < len(full) and full.startswith(raw)
    assert decode_body("abc", "utf8", "br")[1] == "content-encoding 'br' is not supported by the analyzer"
    assert decode_body("not gzip", "utf8", "gzip")[1].startswith("cannot inflate gzip body")
