"""`serve --bridge responses,messages` in front of a chat-only stack (emulated Ollama 0.12, which
answers 404 on /v1/responses and /v1/messages): the openai and anthropic SDKs get native function_call
items / tool_use blocks, streaming included, and the record keeps both requests."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from proxyprocess import start_all, stop_in_background
from test_protocols import MESSAGES_TOOLS, RESPONSES_TOOLS, sql, tp

from toolproxy.emulators import FakeStack, ModelRequest, call, text, text_call
from toolproxy.record.segments import read_records

MODEL = "qwen2.5:7b"


def model(req: ModelRequest):
    if any(
        m.get("role") == "tool" or "<tool_result" in str(m.get("content"))
        for m in req.messages
        if m.get("role") != "system"
    ):
        return text("It is 18 C in Oslo.")
    if not req.tools:  # the text condition: the call is written as text
        return text_call("hermes", "get_weather", {"city": "Oslo"})
    return call("get_weather", {"city": "Oslo"}, content="Checking.")


@pytest.fixture(scope="module")
def fake():
    stack = FakeStack("ollama", responder=model)
    with stack.in_thread():
        yield stack


@pytest.fixture(scope="module")
def proxies(fake, tmp_path_factory):
    started = start_all(
        fake.url,
        {
            name: (tmp_path_factory.mktemp(name), ("--durability", "sync", *args))
            for name, args in (
                ("plain", ()),
                ("bridge", ("--bridge", "responses,messages")),
                ("text", ("--bridge", "responses,messages", "--condition", "text")),
                ("hint", ("--bridge", "responses,messages", "--condition", "hint")),
            )
        },
    )
    yield started
    stop_in_background(started.values())


def oa(p):
    return openai.OpenAI(base_url=f"{p.url}/v1", api_key="sk-test", max_retries=0, timeout=30)


def an(p):
    return anthropic.Anthropic(base_url=p.url, api_key="sk-ant-test", max_retries=0, timeout=30)


def responses(p, stream: bool, **extra):
    kwargs = dict(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS, **extra)
    if not stream:
        return oa(p).responses.create(**kwargs)
    events = list(oa(p).responses.create(stream=True, **kwargs))
    return events[-1].response


def messages(p, stream: bool):
    kwargs = dict(
        model=MODEL, max_tokens=100, tools=MESSAGES_TOOLS, messages=[{"role": "user", "content": "Weather in Oslo?"}]
    )
    if not stream:
        return an(p).messages.create(**kwargs)
    with an(p).messages.stream(**kwargs) as s:
        return s.get_final_message()


def test_a_chat_only_stack_answers_404_without_the_bridge(proxies):
    with pytest.raises(openai.NotFoundError):
        oa(proxies["plain"]).responses.create(model=MODEL, input="hi")
    with pytest.raises(anthropic.NotFoundError):
        an(proxies["plain"]).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("condition", ["bridge", "text", "hint"])
@pytest.mark.parametrize("stream", [False, True])
def test_bridged_calls_come_back_native(proxies, fake, condition, stream):
    p = proxies[condition]
    r = responses(p, stream)
    assert [(i.name, json.loads(i.arguments)) for i in r.output if i.type == "function_call"] == [
        ("get_weather", {"city": "Oslo"})
    ]
    sent = fake.seen[-1]
    assert sent.path == "/v1/chat/completions" and sent.json()["messages"][-1] == {
        "role": "user",
        "content": "Weather in Oslo?",
    }
    assert ("tools" in sent.json()) == (condition != "text")
    assert ("<tool_call>" in json.dumps(sent.json()["messages"])) == (condition != "bridge")  # the taught block
    m = messages(p, stream)
    assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == [("get_weather", {"city": "Oslo"})]
    assert m.stop_reason == "tool_use" and fake.seen[-1].path == "/v1/chat/completions"


def test_a_tool_result_round_trip_through_the_bridge(proxies, fake):
    p = proxies["bridge"]
    first = oa(p).responses.create(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS)
    fc = next(i for i in first.output if i.type == "function_call")
    items = [
        {"role": "user", "content": "Weather in Oslo?"},
        *[i.model_dump(exclude_none=True) for i in first.output],
        {"type": "function_call_output", "call_id": fc.call_id, "output": "18 C"},
    ]
    second = oa(p).responses.create(model=MODEL, input=items, tools=RESPONSES_TOOLS)
    assert second.output_text == "It is 18 C in Oslo."
    sent = fake.seen[-1].json()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"] and sent[2]["tool_call_id"] == fc.call_id
    assert sent[1]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_stored_state_cannot_cross_the_bridge(proxies):
    with pytest.raises(openai.BadRequestError, match="send the whole conversation"):
        oa(proxies["bridge"]).responses.create(model=MODEL, input="and now?", previous_response_id="resp_123")


def test_the_record_keeps_both_requests_and_analyze_reads_them(proxies):
    p = proxies["bridge"]
    responses(p, False)
    recs = [r for r in read_records(p.data, "exchange") if r["path"] == "/v1/responses" and r["status"] == 200]
    rec = recs[-1]
    assert json.loads(rec["request_body"])["input"] == "Weather in Oslo?"
    assert rec["upstream_request"]["path"] == "/v1/chat/completions"
    assert json.loads(rec["upstream_request"]["body"])["messages"] == [{"role": "user", "content": "Weather in Oslo?"}]
    r = tp("analyze", "--data", str(p.data))
    assert r.returncode == 0, r.stderr
    got = sql(
        p.data,
        "SELECT DISTINCT t.outcome, t.surface FROM turns t JOIN exchanges e ON e.id = t.final_exchange_id "
        "WHERE e.path = '/v1/responses' AND e.status = 200 AND t.n_calls > 0",
    )
    assert got == [{"outcome": "valid_call", "surface": "native"}]


def test_the_sdk_stream_helpers_follow_the_bridged_streams(proxies):
    p = proxies["bridge"]
    with oa(p).responses.stream(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS) as s:
        final = s.get_final_response()
    assert [(i.name, json.loads(i.arguments)) for i in final.output if i.type == "function_call"] == [
        ("get_weather", {"city": "Oslo"})
    ]
    with an(p).messages.stream(
        model=MODEL, max_tokens=50, tools=MESSAGES_TOOLS, messages=[{"role": "user", "content": "Weather in Oslo?"}]
    ) as s:
        kinds = [e.type for e in s]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "input_json" in kinds


def test_bridge_flag_names_what_it_accepts():
    r = tp("serve", "--upstream", "http://127.0.0.1:9", "--bridge", "chat,responses")
    assert (
        r.returncode == 2
        and "--bridge takes a comma-separated list of responses, messages, gemini (got 'chat,responses')" in r.stderr
    )
    assert "Traceback" not in r.stderr
