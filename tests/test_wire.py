"""toolproxy.wire: decoders on bytes captured from a real llama-server (tests/data/wire, see
capture.py there), any chunking decodes like the whole body, encoders round-trip through the
decoders, and requests round-trip between the families."""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson
import pytest
from scaling import FACTOR, assert_scales_linearly

from toolproxy import wire
from toolproxy.wire import Call, Decoder, decode, error_of, family_of, read_request, write_request

DATA = Path(__file__).parent / "data" / "wire"
INDEX = json.loads((DATA / "index.json").read_text())
CALL_TEXT = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def _events(body: bytes, family: str, ctype: str | None, cuts: list[int]) -> tuple[list, wire.Reply]:
    d = Decoder(family, ctype)
    events = []
    for a, b in zip([0, *cuts], [*cuts, len(body)]):
        events += d.feed(body[a:b])
    events += d.close()
    return events, d.reply


@pytest.mark.parametrize("name", sorted(INDEX))
def test_captured_bodies_decode_to_what_the_model_wrote(name):
    meta = INDEX[name]
    family = family_of(meta["path"])
    reply = decode((DATA / f"{name}.body").read_bytes(), family, meta["content_type"])
    assert reply.streamed == name.endswith("_stream")
    assert reply.complete and reply.decoded and reply.error is None and reply.unreadable is None
    assert reply.model and reply.model.endswith("qwen2.5-coder-0.5b.gguf")
    assert reply.n_choices == 1 and reply.tool_calls == []
    if family in (wire.CHAT, wire.RESPONSES, wire.MESSAGES):
        assert reply.content == CALL_TEXT  # the call lands in text on this stack, for every protocol
        assert reply.finish_reason == "stop"
        assert (reply.prompt_tokens, reply.completion_tokens) == (165, 17)
    else:
        assert reply.content.startswith("  # a and b are parameters")
        assert reply.finish_reason == "length"
        assert (reply.prompt_tokens, reply.completion_tokens) == (6, 16)
    if name in ("responses_json", "responses_stream", "messages_json", "messages_stream", "chat_stream"):
        assert reply.cached_tokens == 164


@pytest.mark.parametrize("name", sorted(INDEX))
@pytest.mark.parametrize("with_type", [True, False])
def test_every_split_decodes_like_the_whole(name, with_type):
    meta = INDEX[name]
    body = (DATA / f"{name}.body").read_bytes()
    family = family_of(meta["path"])
    ctype = meta["content_type"] if with_type else None
    whole_events, whole = _events(body, family, ctype, [])
    assert whole_events
    for cut in range(1, len(body)):
        events, reply = _events(body, family, ctype, [cut])
        assert (events, reply) == (whole_events, whole), cut
    events, reply = _events(body, family, ctype, list(range(1, len(body))))
    assert (events, reply) == (whole_events, whole)


REPLIES = [
    ("prose", [], "stop", None),
    ("", [Call(0, "call_a", "get_weather", '{"city": "Paris"}')], "tool_calls", None),
    (
        "Let me check.",
        [Call(0, "call_a", "get_weather", '{"city": "Paris"}'), Call(1, "call_b", "get_time", "{}")],
        "tool_calls",
        {
            "prompt_tokens": 12,
            "completion_tokens": 5,
            "total_tokens": 17,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    ),
    (
        "cut sh",
        [],
        "length",
        {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 0}},
    ),
]
ENCODED = [wire.CHAT, wire.OLLAMA_CHAT, wire.RESPONSES, wire.MESSAGES]


@pytest.mark.parametrize("family", ENCODED)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("content,calls,finish,usage", REPLIES)
def test_encode_decode_round_trip(family, stream, content, calls, finish, usage):
    enc = wire.encoder_for(family, {"model": "m", "stream_options": {"include_usage": True}}, stream)
    half = len(content) // 2
    body = enc.delta(content[:half]) + enc.delta(content[half:]) + enc.end("", calls, finish, usage)
    reply = decode(body, family, enc.content_type)
    assert reply.complete and reply.error is None and reply.streamed == stream
    assert (reply.content or "") == content
    assert [(c.name, c.arguments_object()) for c in reply.tool_calls] == [(c.name, c.arguments_object()) for c in calls]
    if family != wire.OLLAMA_CHAT:  # Ollama's calls carry no ids
        assert [c.id for c in reply.tool_calls] == [c.id for c in calls]
    assert reply.finish_reason == (finish if family != wire.OLLAMA_CHAT else {"tool_calls": "stop"}.get(finish, finish))
    if usage is not None:
        assert (reply.prompt_tokens, reply.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
        if family != wire.OLLAMA_CHAT:
            assert reply.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("family", ENCODED)
@pytest.mark.parametrize("stream", [False, True])
def test_encoded_error_reads_back_as_the_error(family, stream):
    enc = wire.encoder_for(family, {"model": "m"}, stream)
    reply = decode(enc.error("model crashed"), family, enc.content_type)
    assert reply.error == "model crashed" and not reply.has_output


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    {"role": "assistant", "content": "Paris is sunny, Rome rainy."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.mark.parametrize("family", [wire.RESPONSES, wire.MESSAGES, wire.CHAT])
@pytest.mark.parametrize(
    "choice", ["auto", "required", "none", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_request_round_trip(family, choice):
    request = wire.Request(wire.CHAT, CONVERSATION, TOOLS, choice, True, "m", {}, {"model": "m", "stream": True})
    body = orjson.loads(orjson.dumps(write_request(family, request)))
    back = read_request(family, body)
    assert back.family == family and back.stream and back.tool_choice == choice
    assert back.tools == TOOLS and back.system == "Be brief."
    norm = [
        {
            **m,
            "tool_calls": [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ],
        }
        if m.get("tool_calls")
        else m
        for m in back.messages
    ]
    want = [
        {
            **m,
            "tool_calls": [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ],
        }
        if m.get("tool_calls")
        else m
        for m in CONVERSATION
    ]
    assert norm == want


def test_responses_request_shapes_as_sdks_send_them():
    body = {
        "model": "m",
        "instructions": "sys",
        "stream": False,
        "max_output_tokens": 5,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}, {"type": "web_search"}],
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
    }
    r = read_request(wire.RESPONSES, body)
    assert r.messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    assert [t["function"]["name"] for t in r.tools] == ["f"]
    assert r.parameters == {
        "max_tokens": 5,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
    }
    assert read_request(wire.RESPONSES, {"input": "hello"}).messages == [{"role": "user", "content": "hello"}]


def test_messages_request_blocks():
    body = {
        "model": "m",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}]},
                    {"type": "text", "text": "and now?"},
                ],
            },
        ],
        "tools": [
            {"name": "f", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "tool_choice": {"type": "any"},
    }
    r = read_request(wire.MESSAGES, body)
    assert r.messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "checking",
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "user", "content": "and now?"},
    ]
    assert r.tool_choice == "required" and [t["function"]["name"] for t in r.tools] == ["f"]


@pytest.mark.parametrize(
    "body,message",
    [
        ({"error": {"message": "boom", "type": "x"}}, "boom"),
        (
            {"error": "registry.ollama.ai/library/gemma3:latest does not support tools"},
            "registry.ollama.ai/library/gemma3:latest does not support tools",
        ),
        ({"object": "error", "message": "flat", "type": "BadRequestError", "code": 400}, "flat"),
        ({"detail": "Not Found"}, "Not Found"),
        ({"detail": [{"loc": ["body"], "msg": "bad"}]}, '[{"loc":["body"],"msg":"bad"}]'),
        ({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "Overloaded"),
        ({"type": "error", "code": "server_error", "message": "stream broke", "param": None}, "stream broke"),
        (
            {
                "type": "response.failed",
                "response": {"status": "failed", "error": {"code": "x", "message": "failed hard"}},
            },
            "failed hard",
        ),
        ({"choices": [{"index": 0, "delta": {"content": "x"}}]}, None),
        ({"type": "response.completed", "response": {"status": "completed", "error": None}}, None),
        ({"id": "r", "object": "response", "status": "completed", "error": None, "output": []}, None),
    ],
)
def test_error_shapes(body, message):
    assert error_of(body) == message


# The three readers used to disagree on these: the condition's reader gave an empty reply.
@pytest.mark.parametrize(
    "body,ctype,want",
    [
        (
            b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\ndata: {"object":"error","message":"worker '
            b'died"}\n\n',
            "text/event-stream",
            ("Hel", "worker died"),
        ),
        (b'{"detail":"Method Not Allowed"}', "application/json", (None, "Method Not Allowed")),
        (
            b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"two lines"},"finish_reason":"stop"}]}\n\ndata: '
            b"[DONE]\n\n",
            "text/event-stream",
            ("two lines", None),
        ),
    ],
)
def test_disagreements_are_gone(body, ctype, want):
    reply = decode(body, wire.CHAT, ctype)
    assert (reply.content, reply.error) == want


def test_many_small_deltas_decode_in_linear_time():
    """Joining many small deltas is linear: 8x the deltas take about 8x as long (measured in the
    same run against 1/8 of the body, see scaling.py); quadratic joining would take ~64x."""
    piece = b'data: {"choices":[{"index":0,"delta":{"content":"ab"}}]}\n\n'
    args = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"x"}}]}}]}\n\n'

    def body(n: int) -> bytes:
        return piece * n + args * n + b"data: [DONE]\n\n"

    big, eighth = body(100_000), body(100_000 // FACTOR)
    replies = []
    assert_scales_linearly(
        lambda: decode(eighth, wire.CHAT, "text/event-stream"),
        lambda: replies.append(decode(big, wire.CHAT, "text/event-stream")),
        "decode",
        max_references=400,
    )
    for reply in replies:
        assert reply.content == "ab" * 100_000 and reply.complete
        assert reply.tool_calls[0].arguments == "x" * 100_000


@pytest.mark.parametrize("family", wire.FAMILIES)
def test_hostile_bodies_never_raise(family):
    rng = random.Random(family)
    samples = [(DATA / f"{n}.body").read_bytes() for n in sorted(INDEX)]
    shapes = [
        b'{"type":"response.output_item.added","item":[1]}',
        b'{"choices":[{"delta":{"tool_calls":[{"index":"x"}]}}]}',
        b'{"type":"content_block_delta","index":99,"delta":{"type":"input_json_delta","partial_json":7}}',
        b'{"message":{"tool_calls":[null,{"function":"f"}]},"done":true,"done_reason":3}',
        b"[1,2]",
        b'"s"',
        b'{"error":null,"choices":null}',
        b'{"type":"message","content":[{"type":"tool_use"}],"usage":[]}',
        b'{"object":"response","output":[{"type":"function_call","arguments":{"a":1}}],"status":"incomplete"}',
    ]
    for _ in range(300):
        base = rng.choice(samples)
        cut = rng.randrange(len(base))
        body = (
            base[:cut]
            + rng.choice([b"", b"\x00\xff", b"data: " + rng.choice(shapes) + b"\n\n", rng.choice(shapes) + b"\n"])
            + base[cut:]
        )
        for ctype in (None, "text/event-stream", "application/x-ndjson", "application/json"):
            d, step = Decoder(family, ctype), rng.randint(1, 400)
            for i in range(0, len(body), step):
                d.feed(body[i : i + step])
            d.close()
            assert isinstance(d.reply.content, (str, type(None)))


@pytest.mark.parametrize("calls", [[5, "x"], "abc", [{"id": "c", "function": "not an object"}], None])
def test_writers_skip_tool_calls_that_are_not_objects(calls):
    """The history is the harness's: odd tool_calls entries are skipped, never a crash."""
    from toolproxy.wire import messages, responses
    from toolproxy.wire.model import Request

    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok", "tool_calls": calls},
        {"role": "user", "content": "again"},
    ]
    for family, writer in (("messages", messages.write_request), ("responses", responses.write_request)):
        body = writer(Request(family=family, messages=history))
        assert "ok" in str(body) and "again" in str(body)


def _sse_by_lines(body: bytes) -> list[tuple[str | None, bytes]]:
    """SSE read the plain way, one line at a time (the oracle for the framer's shortcuts): a
    trailing CR is dropped, `data` lines join with a newline, a blank line (or the end of the
    body) ends an event, comments and unknown fields are skipped."""
    *lines, rest = body.split(b"\n")
    lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    if rest.strip():
        lines.append(rest.rstrip(b"\r"))
    out, event, data = [], None, []
    for line in [*lines, b""]:
        if not line:
            if data:
                out.append((event, b"\n".join(data)))
            event, data = None, []
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value.decode("utf-8", "replace").strip()
    return out


def test_sse_framer_reads_any_split_like_the_plain_line_reading():
    """The framer's shortcuts (whole one-line events split at once, blocks between blank lines)
    give exactly what reading line by line gives, for bodies mixing every SSE line form."""
    from toolproxy.wire.framing import SSEFramer

    rng = random.Random(12)
    lines = [
        b'data: {"a":1}',
        b"data:{}",
        b"data: [DONE]",
        b"data: ",
        b"data",
        b"event: message_start",
        b": ping",
        b"id: 7",
        b"retry: 10",
        b"",
        b"data: x\r",
        b"data:  two spaces",
        b"event:delta\r",
        b"data: data: nested",
    ]
    for _ in range(3000):
        seps = rng.choice([[b"\n\n"], [b"\n", b"\n\n"], [b"\n", b"\r\n", b"\n\n", b"\r\n\r\n"]])
        body = rng.choice([b"", b"\n", b"\n\n"]) + b"".join(
            rng.choice(lines) + rng.choice(seps) for _ in range(rng.randint(0, 8))
        )
        body += rng.choice([b"", b"data: tail", b"data: tail\r\r", b"  "])
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 4)))) if len(body) > 1 else []
        framer, got = SSEFramer(), []
        for a, b in zip([0, *cuts], [*cuts, len(body)]):
            got += framer.feed(body[a:b])
        got += framer.close()
        assert got == _sse_by_lines(body), (body, cuts)


@pytest.mark.parametrize("family", wire.FAMILIES)
def test_decode_reads_a_whole_body_like_feeding_it(family):
    """decode()'s one-pass reading of a whole body gives the reply feeding it in any split does,
    for captured bodies and for the same bodies broken in hostile ways, with and without a type."""
    rng = random.Random(family + "whole")
    samples = [(DATA / f"{n}.body").read_bytes() for n in sorted(INDEX)]
    odd = [
        b"",
        b"  \n",
        b"\x00\xff",
        b"data: [DONE]\n\n",
        b'{"error":{"message":"boom"}}\n',
        b"data: {}\r\n\r\n",
        b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: {"choices"',
        b"[1,2]\n",
        b": ping\n\n",
    ]
    bodies = samples + odd
    for _ in range(150):
        base = rng.choice(samples)
        cut = rng.randrange(len(base))
        bodies.append(base[:cut] + rng.choice(odd) + base[cut:])
    for body in bodies:
        for ctype in (None, "text/event-stream", "application/x-ndjson", "application/json", "text/plain"):
            whole = decode(body, family, ctype)
            step = rng.randint(1, 300)
            d = Decoder(family, ctype)
            for i in range(0, len(body), step):
                d.feed(body[i : i + step])
            d.close()
            assert whole == d.reply, (body[:200], ctype, step)
