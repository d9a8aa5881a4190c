"""OpenAI Responses and Anthropic Messages through a real `toolproxy serve`, with the real openai
and anthropic SDKs, in front of the emulated llama-server (which serves both, as the real one
does): recorded and analysed like chat, and rewritten by every condition so the harness gets
native `function_call` items / `tool_use` blocks back, streaming included."""

from __future__ import annotations

import json
import subprocess
import sys

import anthropic
import openai
import pytest
from proxyprocess import ProxyProcess, start_all, stop_in_background, together

from toolproxy.emulators import FakeStack, ModelRequest, call, text, text_call

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
RESPONSES_TOOLS = [{"type": "function", **WEATHER}]
MESSAGES_TOOLS = [
    {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
]
MODEL = "qwen2.5-coder-0.5b"
ANSWER = "It is 18 C in Oslo."


def model(req: ModelRequest):
    """Qwen-on-llama.cpp as observed: the call comes back as text; after a tool result, an answer."""
    results = [
        m
        for m in req.messages
        if m.get("role") == "tool" or "<tool_result" in str(m.get("content")) and m.get("role") != "system"
    ]
    if results:
        return text(ANSWER)
    return text_call("hermes", "get_weather", {"city": "Oslo"}, before="Let me check. ")


@pytest.fixture(scope="module")
def fake():
    stack = FakeStack("llamacpp", models={MODEL: ["completion", "tools"]}, responder=model, cached_tokens=7)
    with stack.in_thread():
        yield stack


@pytest.fixture(scope="module")
def proxies(fake, tmp_path_factory):
    started = start_all(
        fake.url,
        {
            condition: (
                tmp_path_factory.mktemp(f"data-{condition}"),
                ("--durability", "sync", "--condition", condition),
            )
            for condition in ("native", "text", "hint", "constrained")
        },
    )
    yield started
    stop_in_background(started.values())


def oa(p: ProxyProcess, run: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{p.url}/t/run={run}/v1", api_key="sk-test", max_retries=0, timeout=30)


def an(p: ProxyProcess, run: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{p.url}/t/run={run}", api_key="sk-ant-test", max_retries=0, timeout=30)


def tp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def sql(data, query: str) -> list[dict]:
    r = tp("sql", "--data", str(data), "--format", "json", query)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def responses_call(client: openai.OpenAI, stream: bool, **extra):
    kwargs = dict(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS, **extra)
    if not stream:
        return client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    assert events[-1].type == "response.completed"
    return events[-1].response


def messages_call(client: anthropic.Anthropic, stream: bool, **extra):
    kwargs = dict(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=MESSAGES_TOOLS,
        **extra,
    )
    if not stream:
        return client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as s:
        return s.get_final_message()


@pytest.mark.parametrize("stream", [False, True])
def test_native_call_stays_in_text_for_both_sdks(proxies, stream):
    p = proxies["native"]
    r = responses_call(oa(p, f"resp-native-{stream}"), stream)
    assert [i.type for i in r.output] == ["message"] and "<tool_call>" in r.output_text
    m = messages_call(an(p, f"msg-native-{stream}"), stream)
    assert (
        [b.type for b in m.content] == ["text"] and "<tool_call>" in m.content[0].text and m.stop_reason == "end_turn"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_text_condition_returns_native_calls(proxies, fake, stream):
    p = proxies["text"]
    r = responses_call(oa(p, f"resp-text-{stream}"), stream)
    calls = [i for i in r.output if i.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert r.output_text.strip() == "Let me check." and calls[0].call_id.startswith("call_")
    sent = fake.seen[-1].json()
    assert fake.seen[-1].path == "/v1/responses" and "tools" not in sent and "<tool_call>" in sent["instructions"]

    m = messages_call(an(p, f"msg-text-{stream}"), stream)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Oslo"})] and m.stop_reason == "tool_use"
    assert m.content[0].type == "text" and m.content[0].text.strip() == "Let me check."
    sent = fake.seen[-1].json()
    assert fake.seen[-1].path == "/v1/messages" and "tools" not in sent and "<tool_call>" in sent["system"]


def test_text_condition_second_turn_rewrites_history(proxies, fake):
    p = proxies["text"]
    first = oa(p, "resp-history").responses.create(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS)
    call = next(i for i in first.output if i.type == "function_call")
    items = [
        {"role": "user", "content": "Weather in Oslo?"},
        *[i.model_dump(exclude_none=True) for i in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
    ]
    second = oa(p, "resp-history").responses.create(model=MODEL, input=items, tools=RESPONSES_TOOLS)
    assert second.output_text == ANSWER
    sent = fake.seen[-1].json()
    kinds = [i.get("type", "message") for i in sent["input"]]
    assert kinds == ["message"] * 3  # the call and its result became text the model can read
    assert "<tool_call>" in sent["input"][1]["content"] and "<tool_result" in sent["input"][2]["content"]


def test_hint_keeps_tools_and_adds_the_block(proxies, fake):
    items = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather here?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            ],
        }
    ]
    oa(proxies["hint"], "resp-hint").responses.create(
        model=MODEL, input=items, tools=RESPONSES_TOOLS, instructions="Be brief."
    )
    sent = fake.seen[-1].json()
    assert sent["tools"] == RESPONSES_TOOLS and sent["instructions"].startswith("Be brief.\n\n")
    assert sent["input"] == items  # only the instructions differ from what the harness sent
    an(proxies["hint"], "msg-hint").messages.create(
        model=MODEL, max_tokens=50, tools=MESSAGES_TOOLS, messages=[{"role": "user", "content": "Weather in Oslo?"}]
    )
    sent = fake.seen[-1].json()
    assert [t["name"] for t in sent["tools"]] == ["get_weather"] and "<tool_call>" in sent["system"]


def test_constrained_on_responses_and_a_recorded_skip_on_messages(proxies, fake):
    p = proxies["constrained"]
    r = oa(p, "resp-constrained").responses.create(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS)
    sent = fake.seen[-1].json()
    assert sent["text"]["format"]["type"] == "json_schema" and "tools" not in sent
    assert [(i.name, json.loads(i.arguments)) for i in r.output if i.type == "function_call"] == [
        ("get_weather", {"city": "Oslo"})
    ]
    m = messages_call(an(p, "msg-constrained"), False)
    assert "<tool_call>" in m.content[0].text  # forwarded unchanged
    note = [r["condition_note"] for r in p.wait_records(2) if r["path"] == "/v1/messages"]
    assert note and note[-1].startswith(
        "skipped: on /v1/messages a JSON schema rides in output_config.format, which "
        "only vLLM is known to enforce (this upstream: llamacpp)"
    )


def test_analyze_reads_responses_and_messages_like_chat(proxies):
    p = proxies["native"]
    c = oa(p, "resp-chain")
    first = c.responses.create(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS)
    # stateless continuation (the whole history resent) and stateful (previous_response_id)
    second = c.responses.create(
        model=MODEL,
        tools=RESPONSES_TOOLS,
        input=[
            {"role": "user", "content": "Weather in Oslo?"},
            *[i.model_dump(exclude_none=True) for i in first.output],
            {"role": "user", "content": "And tomorrow?"},
        ],
    )
    c.responses.create(model=MODEL, tools=RESPONSES_TOOLS, previous_response_id=second.id, input="In Bergen?")
    a = an(p, "msg-chain")
    m = a.messages.create(
        model=MODEL, max_tokens=50, tools=MESSAGES_TOOLS, messages=[{"role": "user", "content": "Weather in Oslo?"}]
    )
    a.messages.create(
        model=MODEL,
        max_tokens=50,
        tools=MESSAGES_TOOLS,
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": "thanks"},
        ],
    )
    # Sync durability: each record was on disk before its answer; 3 Responses and 2 Messages exchanges.
    assert len([r for r in p.records() if r["run"] in ("resp-chain", "msg-chain")]) == 5
    r = tp("analyze", "--data", str(p.data))
    assert r.returncode == 0 and "issues: none" in r.stdout, r.stdout + r.stderr
    chains = "('resp-chain', 'msg-chain')"
    turns, episodes, ex, calls = together(
        *[
            lambda q=q: sql(p.data, q)
            for q in (  # read-only: side by side
                f"SELECT run, outcome, surface, count(*) AS n FROM turns WHERE run IN {chains} GROUP BY ALL ORDER BY "
                "run",
                f"SELECT run, n_turns FROM episodes WHERE run IN {chains} ORDER BY run",
                f"SELECT id, run, path, model, prompt_tokens, cached_tokens, stack_marker FROM exchanges "
                f"WHERE run IN {chains} ORDER BY started_at",
                f"SELECT DISTINCT c.name, c.surface, c.format, c.valid FROM calls c JOIN turns t USING (turn_id) "
                f"WHERE t.run IN {chains}",
            )
        ]
    )
    assert turns == [
        {"run": "msg-chain", "outcome": "valid_call", "surface": "text", "n": 2},
        {"run": "resp-chain", "outcome": "valid_call", "surface": "text", "n": 3},
    ]
    assert episodes == [{"run": "msg-chain", "n_turns": 2}, {"run": "resp-chain", "n_turns": 3}]
    assert {e["path"] for e in ex} == {"/v1/responses", "/v1/messages"}
    assert all(e["model"] == MODEL and e["prompt_tokens"] and e["cached_tokens"] == 7 for e in ex), ex
    assert calls == [{"name": "get_weather", "surface": "text", "format": "hermes", "valid": True}]
    first_id = next(e["id"] for e in ex if e["run"] == "resp-chain")
    shown = tp("show", "--data", str(p.data), first_id)
    assert shown.returncode == 0 and "Weather in Oslo?" in shown.stdout and "tools offered: get_weather" in shown.stdout


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """vLLM with a tool parser: serves /v1/messages, parses calls natively, enforces output_config.format."""
    stack = FakeStack("vllm", tool_parser="hermes", responder=lambda req: call("get_weather", {"city": "Oslo"}))
    with stack.in_thread():
        p = ProxyProcess(stack.url, tmp_path_factory.mktemp("vllm"), ("--durability", "sync"))
        yield stack, p
        p.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_messages_native_and_constrained(vllm, stream):
    fake, p = vllm
    client = anthropic.Anthropic(base_url=p.url, api_key="sk-ant-test", max_retries=0, timeout=30)
    kwargs = dict(
        model="Qwen/Qwen2.5-7B-Instruct",
        max_tokens=100,
        tools=MESSAGES_TOOLS,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
    )
    m = messages_call_with(client, stream, kwargs)
    assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == [("get_weather", {"city": "Oslo"})]
    assert m.stop_reason == "tool_use" and fake.seen[-1].path == "/v1/messages"
    constrained = anthropic.Anthropic(base_url=f"{p.url}/t/condition=constrained", api_key="sk-ant-test", max_retries=0)
    m = messages_call_with(constrained, stream, kwargs)
    sent = fake.seen[-1].json()
    assert sent["output_config"]["format"]["type"] == "json_schema" and "tools" not in sent
    assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == [("get_weather", {"city": "Oslo"})]


def messages_call_with(client: anthropic.Anthropic, stream: bool, kwargs: dict):
    if not stream:
        return client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as s:
        return s.get_final_message()


@pytest.mark.parametrize("stream", [False, True])
def test_the_reference_responses_api_through_the_proxy(fake_stack_module, stream):
    """The emulated api.openai.com serves Responses natively: calls come back as function_call
    items and the SDK's stream helper follows the events; an unknown path is its JSON 404."""
    fake, p = fake_stack_module
    client = openai.OpenAI(base_url=f"{p.url}/v1", api_key="sk-test", max_retries=0, timeout=30)
    if stream:
        with client.responses.stream(model="gpt-4o-mini", input="Weather in Oslo?", tools=RESPONSES_TOOLS) as s:
            r = s.get_final_response()
    else:
        r = client.responses.create(model="gpt-4o-mini", input="Weather in Oslo?", tools=RESPONSES_TOOLS)
    assert [(i.name, json.loads(i.arguments)) for i in r.output if i.type == "function_call"] == [
        ("get_weather", {"city": "Oslo"})
    ]
    with pytest.raises(openai.NotFoundError):
        client.post("/nothing-here", cast_to=object, body={})


@pytest.fixture(scope="module")
def fake_stack_module(tmp_path_factory):
    stack = FakeStack(
        "openai", responder=lambda req: call("get_weather", {"city": "Oslo"}) if req.tools else text("hi")
    )
    with stack.in_thread():
        p = ProxyProcess(stack.url, tmp_path_factory.mktemp("openai"), ("--durability", "sync"))
        yield stack, p
        p.stop()
