"""Google's Gemini protocol through a real `toolproxy serve`, with the real google-genai SDK:
read into the one wire model (tables of cases), bridged to a chat-only stack (the emulated
llama-server) with `--bridge gemini`, passed through byte for byte to an upstream that speaks it,
rewritten by a condition, and analysed like every other protocol.

The Gemini-speaking upstream here (`gemini_upstream`) writes Google's documented wire format
(https://ai.google.dev/api/generate-content: a GenerateContentResponse per `data:` event under
`alt=sse`, a JSON array of them written element by element without it, one object for
`:generateContent`; errors as `{"error": {"code", "message", "status"}}`).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import orjson
import pytest
from aiohttp import web
from google import genai
from google.genai import errors, types
from proxyprocess import start_all, stop_in_background
from test_protocols import sql, tp

from toolproxy import wire
from toolproxy.emulators import FakeStack, ModelRequest, call, text
from toolproxy.emulators.faults import raw
from toolproxy.wire import gemini

WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "OBJECT", "properties": {"city": {"type": "STRING"}}, "required": ["city"]},
)
CONFIG = types.GenerateContentConfig(
    tools=[types.Tool(function_declarations=[WEATHER])],
    automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
)
MODEL = "gemini-2.5-flash"
SEEN = web.AppKey("seen", list)


# -- the wire model, by tables of cases


def test_a_path_names_the_protocol_model_and_streaming_mode():
    cases = [
        ("/v1beta/models/gemini-2.5-flash:generateContent", wire.GEMINI, "gemini-2.5-flash", False),
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", wire.GEMINI, "gemini-2.5-flash", True),
        ("/v1/models/m:streamGenerateContent", wire.GEMINI, "m", True),
        ("/v1beta/tunedModels/mine:generateContent", wire.GEMINI, "tunedModels/mine", False),
        ("/v1beta/models/gemini-2.5-flash:countTokens", None, "gemini-2.5-flash", False),
        ("/v1/chat/completions", wire.CHAT, None, False),
    ]
    for path, family, model, streams in cases:
        assert (wire.family_of(path), gemini.model_of(path), wire.streams(family, {}, path)) == (family, model, streams)
    assert gemini.sibling_path("/v1beta/models/m:generateContent", "/v1/chat/completions") == "/v1/chat/completions"
    assert gemini.sibling_path("/gw/v1beta/models/m:countTokens", "/v1/x") == "/gw/v1/x"


def _contents(*contents):
    return {"contents": list(contents)}


def _user(*parts):
    return {"role": "user", "parts": list(parts)}


def _model(*parts):
    return {"role": "model", "parts": list(parts)}


READ_CASES = [
    (
        "a call without an id is answered by name and order",
        _contents(
            _user({"text": "Weather?"}),
            _model({"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}),
            _user({"functionResponse": {"name": "get_weather", "response": {"output": "18 C"}}}),
        ),
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1_0", "name": "get_weather", "content": "18 C"},
        ],
    ),
    (
        "ids given are kept; two calls answered in reverse order; thoughts are no content",
        _contents(
            _model(
                {"text": "thinking", "thought": True},
                {"text": "Both."},
                {"functionCall": {"id": "a", "name": "f", "args": {}}},
                {"functionCall": {"id": "b", "name": "f", "args": {"x": 1}}},
            ),
            _user(
                {"functionResponse": {"id": "b", "name": "f", "response": {"x": 1, "y": 2}}},
                {"functionResponse": {"id": "a", "name": "f", "response": {"output": "A"}}},
            ),
        ),
        [
            {
                "role": "assistant",
                "content": "Both.",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "b", "name": "f", "content": '{"x":1,"y":2}'},
            {"role": "tool", "tool_call_id": "a", "name": "f", "content": "A"},
        ],
    ),
]


@pytest.mark.parametrize("what,body,messages", READ_CASES, ids=[c[0] for c in READ_CASES])
def test_a_gemini_conversation_reads_as_the_chat_a_harness_would_send(what, body, messages):
    request = wire.read_request(wire.GEMINI, body, "/v1beta/models/m:generateContent")
    assert request.messages == messages
    assert request.model == "m" and request.stream is False


def test_tools_tool_config_and_generation_config_in_chat_terms():
    body = {
        "contents": [_user({"text": "hi"})],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "f",
                        "parameters": {
                            "type": "OBJECT",
                            "properties": {"n": {"type": "INTEGER", "nullable": True}, "l": {"type": "ARRAY"}},
                        },
                    },
                    {"name": "g", "parametersJsonSchema": {"type": "object", "additionalProperties": False}},
                ]
            },
            {"googleSearch": {}},
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["g"]}},
        "generationConfig": {"temperature": 0, "maxOutputTokens": 9, "stopSequences": ["X"], "topK": 3},
    }
    r = wire.read_request(wire.GEMINI, body, "/v1beta/models/m:streamGenerateContent")
    assert r.messages[0] == {"role": "system", "content": "Be brief."}
    assert [t["function"] for t in r.tools] == [
        {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": ["integer", "null"]}, "l": {"type": "array"}},
            },
        },
        {"name": "g", "parameters": {"type": "object", "additionalProperties": False}},
    ]
    assert r.tool_choice == {"type": "function", "function": {"name": "g"}}
    assert r.parameters == {"temperature": 0, "max_tokens": 9, "stop": ["X"]}
    assert r.stream is True
    # and back: a Gemini body again, the fields toolproxy does not read kept as they were
    back = wire.write_request(wire.GEMINI, r)
    assert back["generationConfig"] == body["generationConfig"]
    assert back["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["g"]}}
    assert back["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert wire.read_request(wire.GEMINI, back, "/v1beta/models/m:generateContent").messages == r.messages


def test_a_schema_written_with_the_apis_type_names_reaches_chat_as_json_schema():
    """Gemini CLI's routing request asks for its reply in `responseJsonSchema` with `"type":
    "OBJECT"`; the real llama-server refuses that schema (HTTP 400 "JSON schema error at #:
    unrecognized type OBJECT"), so the bridge writes JSON Schema's own names."""
    schema = {"type": "OBJECT", "properties": {"score": {"type": "INTEGER"}}, "required": ["score"]}
    body = {"contents": [_user({"text": "rate"})], "generationConfig": {"responseJsonSchema": schema}}
    sent = wire.write_request(wire.CHAT, wire.read_request(wire.GEMINI, body, "/v1beta/models/m:generateContent"))
    assert sent["response_format"]["json_schema"]["schema"] == {
        "type": "object",
        "properties": {"score": {"type": "integer"}},
        "required": ["score"],
    }


def _sse(*objs) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\r\n\r\n" for o in objs)


def _array(*objs) -> bytes:
    return b"[" + b"\n,\r\n".join(json.dumps(o, indent=2).encode() for o in objs) + b"\n]"


def _chunk(parts, finish=None, usage=None) -> dict:
    candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    out = {"candidates": [candidate], "modelVersion": "gemini-2.5-flash", "responseId": "r1"}
    if usage:
        out["usageMetadata"] = usage
    return out


CALL_STREAM = [
    _chunk([{"text": "Let me ", "thought": True}]),
    _chunk([{"text": "Checking "}]),
    _chunk([{"text": "{now}"}, {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}]),
    _chunk(
        [{"text": ""}],
        "STOP",
        {"promptTokenCount": 10, "candidatesTokenCount": 4, "thoughtsTokenCount": 2, "cachedContentTokenCount": 3},
    ),
]
DECODE_CASES = [
    ("sse", _sse(*CALL_STREAM), "text/event-stream"),
    ("array", _array(*CALL_STREAM), "application/json; charset=UTF-8"),
    ("array, no content type", _array(*CALL_STREAM), None),
]


@pytest.mark.parametrize("what,body,content_type", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_a_streamed_reply_in_any_framing_and_any_chunking(what, body, content_type):
    whole = wire.decode(body, wire.GEMINI, content_type)
    assert (whole.content, whole.reasoning_content, whole.finish_reason) == ("Checking {now}", "Let me ", "tool_calls")
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert (whole.prompt_tokens, whole.completion_tokens, whole.cached_tokens) == (10, 6, 3)
    assert whole.streamed and whole.complete and whole.model == "gemini-2.5-flash" and whole.id == "r1"
    byte_by_byte = wire.Decoder(wire.GEMINI, content_type)
    for i in range(len(body)):
        byte_by_byte.feed(body[i : i + 1])
    byte_by_byte.close()
    assert byte_by_byte.reply == whole


REPLY_CASES = [
    (
        "the server could not parse the model's call",
        _chunk([], "MALFORMED_FUNCTION_CALL"),
        None,
        "malformed_function_call",
    ),
    ("cut by the token limit", _chunk([{"text": "abc"}], "MAX_TOKENS"), None, "length"),
    ("blocked", _chunk([], "SAFETY"), None, "content_filter"),
    (
        "the prompt was blocked: no candidate",
        {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}},
        "the prompt was blocked: PROHIBITED_CONTENT",
        None,
    ),
    (
        "an error object",
        {"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}},
        "Resource exhausted",
        None,
    ),
]


@pytest.mark.parametrize("what,obj,error,finish", REPLY_CASES, ids=[c[0] for c in REPLY_CASES])
def test_what_a_reply_says_beside_its_content(what, obj, error, finish):
    reply = wire.decode(orjson.dumps(obj), wire.GEMINI, "application/json")
    assert (reply.error, reply.finish_reason) == (error, finish)


@pytest.mark.parametrize("stream,sse", [(False, False), (True, True), (True, False)])
def test_what_the_encoder_writes_reads_back(stream, sse):
    encoder = gemini.GeminiEncoder(model="m", stream=stream, sse=sse)
    body = encoder.delta("Hello ") + encoder.end(
        "there", [wire.Call(0, "c1", "f", '{"a": 1}')], "stop", {"prompt_tokens": 3, "completion_tokens": 2}
    )
    reply = wire.decode(body, wire.GEMINI, encoder.content_type)
    assert (reply.content, reply.finish_reason, reply.prompt_tokens, reply.streamed) == (
        "Hello there",
        "tool_calls",
        3,
        stream,
    )
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("c1", "f", {"a": 1})]
    if stream and not sse:
        assert isinstance(json.loads(body), list)  # one JSON array, as Google writes it


# -- through a real proxy, with the real SDK


def weather(req: ModelRequest):
    if any(m.get("role") == "tool" for m in req.messages):
        return text("It is 18 C in Oslo.")
    if not req.tools:  # the text condition: the call written as text
        return text('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    return call("get_weather", {"city": "Oslo"}, content="Checking.")


@pytest.fixture(scope="module")
def fake():
    stack = FakeStack("llamacpp", responder=weather)
    with stack.in_thread():
        yield stack


async def _gemini_answer(request: web.Request) -> web.StreamResponse:
    """A Gemini-speaking upstream, as documented (module docstring): it answers every request with
    a call to get_weather written as text (a model whose call the server did not parse), or, after
    a functionResponse, the answer."""
    body = await request.json()
    request.app[SEEN].append((request.path_qs, body))
    if request.path == "/v1/chat/completions":  # a chat stack reading a long prompt: keep-alives first
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b": keep-alive\n\n")
        await asyncio.sleep(0.3)
        delta = {"choices": [{"index": 0, "delta": {"content": "Hi."}, "finish_reason": "stop"}]}
        await resp.write(b"data: " + orjson.dumps(delta) + b"\n\ndata: [DONE]\n\n")
        return resp
    answered = any("functionResponse" in p for c in body["contents"] for p in c["parts"])
    said = (
        "It is 18 C." if answered else '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    last = _chunk([{"text": said[len(said) // 2 :]}], "STOP", {"promptTokenCount": 5, "candidatesTokenCount": 7})
    first = _chunk([{"text": said[: len(said) // 2]}])
    if request.path.endswith(":generateContent"):
        whole = _chunk([{"text": said}], "STOP", last["usageMetadata"])
        return web.json_response(whole)
    sse = request.query.get("alt") == "sse"
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream" if sse else "application/json; charset=UTF-8"}
    )
    await resp.prepare(request)
    await resp.write(_sse(first) if sse else b"[" + orjson.dumps(first))
    await resp.write(_sse(last) if sse else b"\n,\r\n" + orjson.dumps(last) + b"\n]")
    return resp


@pytest.fixture(scope="module")
def gemini_upstream():
    import threading

    app = web.Application()
    app[SEEN] = []
    app.router.add_post("/{tail:.*}", _gemini_answer)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", app[SEEN]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.fixture(scope="module")
def proxies(fake, gemini_upstream, tmp_path_factory):
    runs = {
        "bridge": (fake.url, ("--bridge", "gemini")),
        "bridge-text": (fake.url, ("--bridge", "gemini", "--condition", "text")),
        "native": (gemini_upstream[0], ()),
        "slow": (gemini_upstream[0], ("--bridge", "gemini")),
        "text": (gemini_upstream[0], ("--condition", "text")),
    }
    started = {}
    for name, (upstream, args) in runs.items():
        started.update(start_all(upstream, {name: (tmp_path_factory.mktemp(name), ("--durability", "sync", *args))}))
    yield started
    stop_in_background(started.values())


def client(p) -> genai.Client:
    return genai.Client(api_key="gk-test", http_options=types.HttpOptions(base_url=p.url, timeout=30_000))


def generate(p, stream: bool, contents="Weather in Oslo?"):
    c = client(p)
    if not stream:
        return c.models.generate_content(model=MODEL, contents=contents, config=CONFIG)
    chunks = list(c.models.generate_content_stream(model=MODEL, contents=contents, config=CONFIG))
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    parts = [p for ch in chunks for p in ch.candidates[0].content.parts or []]
    return types.GenerateContentResponse(candidates=[types.Candidate(content=types.Content(role="model", parts=parts))])


@pytest.mark.parametrize("name", ["bridge", "bridge-text", "text"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_sdk_gets_a_function_call_part(proxies, fake, name, stream):
    r = generate(proxies[name], stream)
    assert [(f.name, f.args) for f in r.function_calls] == [("get_weather", {"city": "Oslo"})]
    if name.startswith("bridge"):
        sent = fake.seen[-1]
        assert sent.path == "/v1/chat/completions"
        assert sent.json()["model"] == MODEL and sent.json().get("stream", False) is stream
        assert ("tools" in sent.json()) == (name == "bridge")


def test_a_function_response_round_trip_through_the_bridge(proxies, fake):
    p = proxies["bridge"]
    first = generate(p, stream=False)
    fc = first.function_calls[0]
    history = [
        types.Content(role="user", parts=[types.Part(text="Weather in Oslo?")]),
        first.candidates[0].content,
        types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(id=fc.id, name=fc.name, response={"output": "18 C"})
                )
            ],
        ),
    ]
    second = generate(p, stream=True, contents=history)
    assert second.text == "It is 18 C in Oslo."
    messages = fake.seen[-1].json()["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == messages[-1]["tool_call_id"] == fc.id
    assert messages[-1]["content"] == "18 C"


def test_count_tokens_is_answered_from_the_stacks_count(proxies, fake):
    c = client(proxies["bridge"])  # kept: the SDK closes its transport when the client is collected
    r = c.models.count_tokens(model=MODEL, contents="How many tokens is this?")
    assert r.total_tokens > 0
    assert fake.seen[-1].path == "/v1/messages/count_tokens"
    assert fake.seen[-1].json()["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "How many tokens is this?"}]}
    ]


def test_an_upstream_error_reaches_the_sdk_as_an_error(proxies, fake):
    fake.inject(raw(b'{"error":{"code":500,"message":"model crashed","type":"server_error"}}', status=500))
    with pytest.raises(errors.ServerError) as caught:
        generate(proxies["bridge"], stream=True)
    assert "model crashed" in str(caught.value)


def test_a_stacks_keepalive_reaches_a_bridged_sse_client(proxies):
    async def read() -> bytes:
        async with aiohttp.ClientSession() as session:
            url = proxies["slow"].url + f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
            async with session.post(url, json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}) as resp:
                first = await resp.content.readany()
                return first + await resp.read()

    body = asyncio.run(read())
    assert body.startswith(b": keep-alive\n\n")  # passed on before any event, as the stack sent it
    assert wire.decode(body, wire.GEMINI, "text/event-stream").content == "Hi."


def test_a_gemini_upstream_gets_the_bytes_the_client_sent_and_the_client_gets_its_bytes(proxies, gemini_upstream):
    _, seen = gemini_upstream
    before = len(seen)
    r = generate(proxies["native"], stream=True)
    assert r.function_calls is None  # the server did not parse the call: passed on as text
    path, body = seen[-1]
    assert len(seen) == before + 1 and path.endswith(":streamGenerateContent?alt=sse")
    assert body["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"


def test_the_text_condition_rewrites_a_gemini_request_for_a_gemini_upstream(proxies, gemini_upstream):
    _, seen = gemini_upstream
    generate(proxies["text"], stream=False)
    path, body = seen[-1]
    assert path.endswith(":generateContent") and "tools" not in body and "toolConfig" not in body
    assert "<tool_call>" in json.dumps(body["systemInstruction"])  # the taught block


def test_analyze_reads_gemini_like_every_protocol(proxies):
    p = proxies["native"]
    generate(p, stream=False)
    generate(p, stream=True)  # this test's own: xdist may run the module's others in another worker
    r = tp("analyze", "--data", str(p.data))
    assert r.returncode == 0, r.stderr
    rows = sql(
        p.data,
        "SELECT path, is_attempt, model, outcome, surface, n_calls, prompt_tokens, streamed FROM exchanges "
        "WHERE is_attempt ORDER BY started_at",
    )
    assert rows and all(r["model"] == MODEL and r["outcome"] == "valid_call" for r in rows)
    assert {r["surface"] for r in rows} == {"text"}  # the call was left in the text by the server
    assert {r["streamed"] for r in rows} >= {False, True}
    b = proxies["bridge"]
    generate(b, stream=True)
    c = client(b)
    c.models.count_tokens(model=MODEL, contents="hi")
    assert tp("analyze", "--data", str(b.data)).returncode == 0
    counted = sql(b.data, "SELECT count(*) AS n FROM exchanges WHERE path LIKE '%:countTokens' AND NOT is_attempt")
    assert counted[0]["n"] >= 1
    delivered = sql(
        b.data, "SELECT count(*) AS n FROM exchanges WHERE is_attempt AND outcome = 'valid_call' AND surface = 'native'"
    )
    assert delivered[0]["n"] >= 1
