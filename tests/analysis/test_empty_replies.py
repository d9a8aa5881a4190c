"""Empty replies told apart: the model stopped at once, a stop string the harness sent cut the reply,
or the stack generated text and delivered none. Only the last is a serving failure (`swallowed`).

The evidence is what the record holds, read the same way on every protocol, streamed or not:
token counts against what was delivered, the request's stop strings, and the stack's own word
for why it stopped (llama.cpp `stop_type`/`stopping_word`, SGLang `matched_stop`, vLLM
`stop_reason`, Anthropic `stop_sequence`). The real llama-server's bodies (tests/data/wire/empty,
captured by capture.py there) are the reference, and the emulated stacks must give the same verdict.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import orjson
import pytest

from toolproxy.analysis.classify.attempt import classify, empty_cause
from toolproxy.analysis.classify.outcomes import MODEL_STOPPED, NON_RESPONSE, STOP_STRING
from toolproxy.analysis.classify.record import analyze_record
from toolproxy.emulators import FakeStack, call, text
from toolproxy.wire import decode, family_of, stop_strings

DATA = Path(__file__).parents[1] / "data" / "wire" / "empty"
INDEX = json.loads((DATA / "index.json").read_text())
STOPS = ["Observation:", "Calling tools:"]


def verdict(body: bytes, path: str, request: dict | None = None, ctype: str | None = None) -> tuple[str, str | None]:
    reply = decode(body, family_of(path), ctype)
    c = classify(reply, status=200, error_kind=None, tools=None, stops=stop_strings(request or {}))
    return c.outcome, c.sub_kind


@pytest.mark.parametrize("name", sorted(INDEX))
def test_what_the_real_llama_server_sent(name):
    """Every protocol family, streamed or not, with or without a usage block: one verdict per cause."""
    meta = INDEX[name]
    assert meta["status"] == 200
    expected = {"eos": MODEL_STOPPED, "stop": STOP_STRING}[name.split("_")[0]]
    assert verdict((DATA / f"{name}.body").read_bytes(), meta["path"], meta["request"], meta["content_type"]) == (
        NON_RESPONSE,
        expected,
    )


def test_the_capture_covers_every_family_streamed_and_not():
    families = {(family_of(m["path"]), m["request"].get("stream", False)) for m in INDEX.values()}
    assert {(f, s) for f in ("chat", "responses", "messages") for s in (False, True)} <= families
    eos_chat_stream = (DATA / "eos_chat_stream.body").read_bytes()
    assert b'"usage"' not in eos_chat_stream and b'"predicted_n":1' in eos_chat_stream  # only timings count it


def _chat(content="", usage=None, finish="stop", **choice) -> bytes:
    body = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish, **choice}
        ]
    }
    if usage is not None:
        body["usage"] = {"prompt_tokens": 40, "completion_tokens": usage, "total_tokens": 40 + usage}
    return orjson.dumps(body)


def _stream(*chunks: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _ollama(eval_count: int, content: str = "") -> bytes:
    return orjson.dumps(
        {
            "model": "qwen",
            "message": {"role": "assistant", "content": content},
            "done": True,
            "done_reason": "stop",
            "eval_count": eval_count,
            "prompt_eval_count": 30,
        }
    )


CHAT, RESPONSES, MESSAGES, OLLAMA, COMPLETION = (
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/api/chat",
    "/completion",
)
# (id, path, body, request, sub_kind)
CASES = [
    ("chat: end token only", CHAT, _chat(usage=1), {}, MODEL_STOPPED),
    ("chat: end token, stop strings sent but not used", CHAT, _chat(usage=1), {"stop": STOPS}, MODEL_STOPPED),
    ("chat: whitespace and the end token", CHAT, _chat("\n\n", usage=3), {}, MODEL_STOPPED),
    ("chat: a stop string's worth of tokens", CHAT, _chat(usage=3), {"stop": STOPS}, STOP_STRING),
    ("chat: one stop string, not a list", CHAT, _chat(usage=4), {"stop": "Observation:"}, STOP_STRING),
    ("chat: more tokens than any stop string takes", CHAT, _chat(usage=40), {"stop": STOPS}, "swallowed"),
    ("chat: tokens and nothing delivered", CHAT, _chat(usage=17), {}, "swallowed"),
    ("chat: whitespace does not account for many tokens", CHAT, _chat(" ", usage=9), {}, "swallowed"),
    ("chat: no count at all", CHAT, _chat(), {}, "empty"),
    ("chat: zero tokens", CHAT, _chat(usage=0), {}, "empty"),
    (
        "chat stream: llama.cpp timings, no usage block",
        CHAT,
        _stream(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]},
            {
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "timings": {"predicted_n": 1, "cache_n": 3},
            },
        ),
        {},
        MODEL_STOPPED,
    ),
    (
        "chat stream: llama.cpp timings say 30 tokens",
        CHAT,
        _stream({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": {"predicted_n": 30}}),
        {},
        "swallowed",
    ),
    (
        "chat stream: neither usage nor timings",
        CHAT,
        _stream({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": "stop"}]}),
        {},
        "empty",
    ),
    ("SGLang: matched_stop is the end token's id", CHAT, _chat(matched_stop=151645), {}, MODEL_STOPPED),
    (
        "SGLang: matched_stop is the stop string",
        CHAT,
        _chat(usage=4, matched_stop="Observation:"),
        {"stop": STOPS},
        STOP_STRING,
    ),
    ("SGLang: matched_stop string, no count", CHAT, _chat(matched_stop="Calling tools:"), {"stop": STOPS}, STOP_STRING),
    (
        "vLLM: stop_reason names the stop string",
        CHAT,
        _chat(usage=4, stop_reason="Observation:"),
        {"stop": STOPS},
        STOP_STRING,
    ),
    ("vLLM: stop_reason null is no evidence either way", CHAT, _chat(usage=1, stop_reason=None), {}, MODEL_STOPPED),
    (
        "/completion: stop_type eos",
        COMPLETION,
        orjson.dumps({"content": "", "stop": True, "stop_type": "eos", "tokens_predicted": 1}),
        {},
        MODEL_STOPPED,
    ),
    (
        "/completion: stop_type eos after 12 eaten tokens",
        COMPLETION,
        orjson.dumps({"content": "", "stop": True, "stop_type": "eos", "tokens_predicted": 12}),
        {},
        "swallowed",
    ),
    (
        "/completion: stop_type word, more tokens than the word",
        COMPLETION,
        orjson.dumps(
            {"content": "", "stop": True, "stop_type": "word", "stopping_word": "Obs:", "tokens_predicted": 40}
        ),
        {"stop": ["Obs:"]},
        "swallowed",
    ),
    (
        "/completion: a one-token stop string the stack names",
        COMPLETION,
        orjson.dumps({"content": "", "stop": True, "stop_type": "word", "stopping_word": "\n", "tokens_predicted": 1}),
        {"stop": ["\n"]},
        STOP_STRING,
    ),
    (
        "Responses: no output item, 1 output token",
        RESPONSES,
        orjson.dumps(
            {
                "object": "response",
                "status": "completed",
                "output": [],
                "usage": {"input_tokens": 9, "output_tokens": 1},
            }
        ),
        {},
        MODEL_STOPPED,
    ),
    (
        "Responses: no output item, 25 output tokens",
        RESPONSES,
        orjson.dumps(
            {
                "object": "response",
                "status": "completed",
                "output": [],
                "usage": {"input_tokens": 9, "output_tokens": 25},
            }
        ),
        {},
        "swallowed",
    ),
    (
        "Anthropic: stop_reason stop_sequence",
        MESSAGES,
        orjson.dumps(
            {
                "type": "message",
                "content": [],
                "stop_reason": "stop_sequence",
                "stop_sequence": "Observation:",
                "usage": {"input_tokens": 9, "output_tokens": 3},
            }
        ),
        {"stop_sequences": STOPS},
        STOP_STRING,
    ),
    (
        "Anthropic: end_turn, 1 output token",
        MESSAGES,
        orjson.dumps(
            {
                "type": "message",
                "content": [],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 9, "output_tokens": 1},
            }
        ),
        {},
        MODEL_STOPPED,
    ),
    ("Ollama native: eval_count 1", OLLAMA, _ollama(1), {}, MODEL_STOPPED),
    ("Ollama native: a dropped call's tokens", OLLAMA, _ollama(9), {}, "swallowed"),
    ("Ollama native: options.stop", OLLAMA, _ollama(4), {"options": {"stop": ["Observation:"]}}, STOP_STRING),
]


@pytest.mark.parametrize("path,body,request_body,sub_kind", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_empty_reply_causes(path, body, request_body, sub_kind):
    assert verdict(body, path, request_body) == (NON_RESPONSE, sub_kind)


def test_the_detail_says_what_happened_in_words():
    stopped = empty_cause(decode(_chat(usage=1), "chat"))
    assert stopped == (
        MODEL_STOPPED,
        "the model ended its turn at once: 1 completion token, its end token, and no text",
    )
    cut = empty_cause(decode(_chat(usage=4, matched_stop="Observation:"), "chat"), STOPS)
    assert cut == (
        STOP_STRING,
        "a stop string the harness sent cut the reply before any text: 'Observation:' (4 completion tokens)",
    )
    eaten = empty_cause(decode(_chat(usage=17), "chat"))
    assert eaten == (
        "swallowed",
        "nothing delivered although the stack reports 17 completion tokens, more than an end token accounts for",
    )


def test_under_a_condition_the_stacks_own_reply_is_the_evidence():
    """`text` rewrites the reply: the harness's streamed copy carries no usage (it asked for none),
    but the stack's reply it came from counts the one end token."""
    upstream = (DATA / "eos_chat_json.body").read_text()
    client = _stream(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ).decode()
    body = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    }
    rec = {
        "id": "x1",
        "started_at": 1.0,
        "kind": "exchange",
        "method": "POST",
        "path": CHAT,
        "status": 200,
        "condition": "text",
        "request_body": json.dumps(body),
        "upstream_request": {"path": CHAT, "body": None},
        "response_body": upstream,
        "response_headers": [["Content-Type", "application/json"]],
        "client_status": 200,
        "client_body": client,
    }
    row = analyze_record(rec, "seg", 0).exchange
    assert (row["outcome"], row["sub_kind"]) == (NON_RESPONSE, MODEL_STOPPED)
    assert orjson.loads(row["record"])["classification_detail"].startswith("the model ended its turn at once")


# The emulated stacks: the same model behaviour gives the same verdict on every family each serves.
FAMILY_BODIES = {
    CHAT: lambda stream, stops: {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
        **({"stop": stops} if stops else {}),
    },
    RESPONSES: lambda stream, stops: {
        "model": "m",
        "input": "hi",
        "stream": stream,
        **({"stop": stops} if stops else {}),
    },
    MESSAGES: lambda stream, stops: {
        "model": "m",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        **({"stop_sequences": stops} if stops else {}),
    },
    OLLAMA: lambda stream, stops: {
        "model": "qwen2.5:7b",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        **({"options": {"stop": stops}} if stops else {}),
    },
    COMPLETION: lambda stream, stops: {"prompt": "hi", "stream": stream, **({"stop": stops} if stops else {})},
}
EMULATED = [("llamacpp", p) for p in (CHAT, RESPONSES, MESSAGES, COMPLETION)] + [
    ("vllm", CHAT),
    ("vllm", MESSAGES),
    ("sglang", CHAT),
    ("ollama", CHAT),
    ("ollama", OLLAMA),
    ("openai", CHAT),
]


def _post(fake: FakeStack, path: str, body: dict) -> tuple[bytes, str | None]:
    with fake.in_thread() as url:
        req = urllib.request.Request(url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read(), resp.headers.get("Content-Type")


def _ask(
    stack: str, path: str, reply, stream: bool, stops: list[str] | None, usage: bool = True
) -> tuple[str, str | None, bytes]:
    """The emulated stack's answer to one request of `path`'s family, and its verdict."""
    fake = FakeStack(stack, replies=[reply])
    body = {**FAMILY_BODIES[path](stream, stops), "model": fake.model}
    if not usage:
        body.pop("stream_options", None)
    data, ctype = _post(fake, path, body)
    return (*verdict(data, path, body, ctype), data)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("stack,path", EMULATED, ids=[f"{s}{p}" for s, p in EMULATED])
def test_emulated_stacks_tell_the_causes_apart(stack, path, stream):
    assert _ask(stack, path, text(""), stream, None)[:2] == (NON_RESPONSE, MODEL_STOPPED)
    assert _ask(stack, path, text("Observation: it is sunny"), stream, STOPS)[:2] == (NON_RESPONSE, STOP_STRING)


@pytest.mark.parametrize("stack", ["openai", "vllm", "ollama"])
def test_a_stream_with_no_count_and_no_stop_reason_stays_empty(stack):
    """Without stream_options.include_usage these stacks send no count and no stop evidence: nothing
    tells an end token from eaten text, so the verdict says so instead of guessing either way."""
    assert _ask(stack, CHAT, text(""), True, None, usage=False)[:2] == (NON_RESPONSE, "empty")


def test_emulated_llama_server_empty_replies_have_the_captured_shape():
    """No output item in an empty Responses reply; Messages names the stop sequence under end_turn;
    /completion says stop_type word and which; the chat stream counts in timings only."""
    responses = orjson.loads(_ask("llamacpp", RESPONSES, text(""), False, None)[2])
    assert responses["output"] == [] and responses["usage"]["output_tokens"] == 1
    messages = orjson.loads(_ask("llamacpp", MESSAGES, text("Observation: x"), False, STOPS)[2])
    assert (messages["content"], messages["stop_reason"], messages["stop_sequence"]) == ([], "end_turn", "Observation:")
    completion = orjson.loads(_ask("llamacpp", COMPLETION, text("Observation: x"), False, STOPS)[2])
    assert (completion["content"], completion["stop_type"], completion["stopping_word"]) == ("", "word", "Observation:")
    chat = _ask("llamacpp", CHAT, text(""), True, None, usage=False)
    assert b'"usage"' not in chat[2] and b'"predicted_n":1' in chat[2] and chat[:2] == (NON_RESPONSE, MODEL_STOPPED)


def test_emulated_ollama_dropping_a_call_is_swallowed():
    """Ollama's parser drops a call to a tool that was not offered: the tokens were generated."""
    body = {
        "model": "qwen2.5:7b",
        "stream": False,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    }
    data, _ = _post(FakeStack("ollama", replies=[call("get_stock", {"ticker": "X"})]), OLLAMA, body)
    assert orjson.loads(data)["message"]["content"] == ""
    assert verdict(data, OLLAMA, body) == (NON_RESPONSE, "swallowed")
