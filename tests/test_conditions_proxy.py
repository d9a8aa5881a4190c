"""hint, text and constrained through the real proxy subprocess, in front of the fake stacks,
with the official openai SDK (and aiohttp for Ollama's native API)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest

from toolproxy.conditions.toolblock import render_block
from toolproxy.emulators import call, calls, text

DATA = Path(__file__).parent / "data"
TOOLS = json.loads((DATA / "hint_tools.json").read_text())
ASK = [{"role": "user", "content": "What's the weather in Oslo?"}]


def client(p, prefix: str = "") -> openai.OpenAI:
    return openai.OpenAI(base_url=p.url + prefix + "/v1", api_key="sk-test", max_retries=0)


def stream_message(stream) -> tuple[str, dict[int, dict], str | None, object, int]:
    """Reassemble an SDK stream: (content, calls by index, finish_reason, usage, content chunk count)."""
    content, found, finish, usage, pieces = "", {}, None, None, 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                content += choice.delta.content
                pieces += 1
            for tc in choice.delta.tool_calls or []:
                slot = found.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            finish = choice.finish_reason or finish
    return content, found, finish, usage, pieces


def upstream_body(rec: dict) -> dict:
    return orjson.loads(rec["upstream_request"]["body"])


# ---------------------------------------------------------------- text


@pytest.mark.parametrize("stack", ["llamacpp", "vllm", "ollama", "sglang"])
def test_text_non_streaming_gives_standard_tool_calls(served, stack):
    options = {"tool_parser": "hermes"} if stack in ("vllm", "sglang") else {}
    fake, p = served(stack, "--condition", "text", **options)
    fake.enqueue(call("get_weather", {"city": "Oslo"}, content="Checking."))
    r = client(p).chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert msg.tool_calls[0].id.startswith("call_") and msg.tool_calls[0].type == "function"

    sent = fake.seen[-1].json()
    assert "tools" not in sent and "tool_choice" not in sent
    assert sent["messages"][0] == {"role": "system", "content": render_block(TOOLS)}
    [rec] = p.wait_records(1)
    assert rec["condition"] == "text"
    assert "tools" in orjson.loads(rec["request_body"])  # before
    assert "tools" not in upstream_body(rec)  # after
    assert (
        "<tool_call>" in orjson.loads(rec["response_body"])["choices"][0]["message"]["content"]
    )  # what the model wrote
    assert (
        orjson.loads(rec["client_body"])["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    )
    assert rec["condition_note"] == "1 call(s) parsed from the reply"


@pytest.mark.parametrize("include_usage", [True, False])
def test_text_streaming_re_emits_standard_sse(served, include_usage):
    fake, p = served("llamacpp", "--condition", "text")
    fake.enqueue(calls(("get_weather", {"city": "Oslo"}), ("list_todos", {}), content="Two things to check first. "))
    kwargs = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = client(p).chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS, stream=True, **kwargs)
    content, found, finish, usage, pieces = stream_message(stream)
    assert content == "Two things to check first. "
    assert pieces > 1  # prose arrived as the model wrote it, not in one piece at the end
    assert finish == "tool_calls"
    assert [(found[i]["name"], json.loads(found[i]["arguments"])) for i in sorted(found)] == [
        ("get_weather", {"city": "Oslo"}),
        ("list_todos", {}),
    ]
    assert all(found[i]["id"] for i in found)
    assert (usage is not None) is include_usage
    assert fake.seen[-1].json()["stream_options"] == {
        "include_usage": True
    }  # asked upstream either way, for the record
    [rec] = p.wait_records(1)
    assert rec["client_body"].endswith("data: [DONE]\n\n")
    assert rec["response_body"].count("data: ") > 3  # the raw upstream SSE is kept as it came


def test_text_prose_reply_streams_and_ends_with_stop(served):
    fake, p = served("vllm", "--condition", "text", tool_parser="hermes")
    fake.enqueue(text("It is usually mild in Oslo this time of year, no tool needed."))
    content, found, finish, _, pieces = stream_message(
        client(p).chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS, stream=True)
    )
    assert content == "It is usually mild in Oslo this time of year, no tool needed."
    assert found == {} and finish == "stop" and pieces > 5


def test_text_unparseable_call_comes_back_as_content_not_an_error(served):
    fake, p = served("llamacpp", "--condition", "text")
    broken = '<tool_call>{"name": "get_weather", "arguments": {"city": Oslo}}</tool_call>'
    fake.enqueue(text(broken))
    r = client(p).chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS)
    assert r.choices[0].message.content == broken
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    [rec] = p.wait_records(1)
    assert rec["client_status"] == 200 and rec["condition_note"] == "call syntax held back but no call recovered"


def test_text_three_turn_episode_round_trips_tool_results(served):
    fake, p = served("ollama", "--condition", "text")
    fake.enqueue(
        call("get_weather", {"city": "Oslo"}),
        call("search_files", {"patterns": ["*.md"]}, content="Now the notes."),
        text("Oslo is 4 C and your notes are in README.md."),
    )
    c = client(p)
    messages = list(ASK)
    for turn in range(3):
        r = c.chat.completions.create(model=fake.model, messages=messages, tools=TOOLS)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": f"result of {tc.function.name} #{turn}"})
    assert messages[-1] == {"role": "assistant", "content": "Oslo is 4 C and your notes are in README.md."}
    first_id = messages[1]["tool_calls"][0]["id"]

    third = fake.seen[-1].json()["messages"]
    assert "tools" not in fake.seen[-1].json()
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[2]["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    assert (
        third[3]["content"]
        == f'<tool_result id="{first_id}" name="get_weather">\nresult of get_weather #0\n</tool_result>'
    )
    assert third[4]["content"].startswith('Now the notes.\n<tool_call>{"name": "search_files"')
    assert "tool_calls" not in third[2] and all(m["role"] != "tool" for m in third)
    recs = p.wait_records(3)
    assert [r["condition_note"] for r in recs] == ["1 call(s) parsed from the reply"] * 2 + [
        "no call marker in the reply"
    ]


async def test_text_ollama_native_chat_ndjson(served):
    fake, p = served("ollama", "--condition", "text")
    fake.enqueue(call("get_weather", {"city": "Oslo", "days": 3.0}, content="On it."))
    body = {"model": fake.model, "messages": ASK, "tools": TOOLS}
    async with aiohttp.ClientSession() as s, s.post(p.url + "/api/chat", json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/x-ndjson"
        lines = [orjson.loads(line) for line in (await r.read()).splitlines()]
    assert "".join(x["message"]["content"] for x in lines) == "On it."
    [with_calls] = [x for x in lines if x["message"].get("tool_calls")]
    assert with_calls["message"]["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3.0}}}
    ]
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert "tools" not in fake.seen[-1].json() and fake.seen[-1].path == "/api/chat"


def test_text_upstream_refusal_passes_through_unchanged(served):
    fake, p = served("ollama", "--condition", "text")
    with pytest.raises(openai.NotFoundError) as info:
        client(p).chat.completions.create(model="no-such-model", messages=ASK, tools=TOOLS)
    assert "not found" in str(info.value)
    [rec] = p.wait_records(1)
    assert rec["status"] == rec["client_status"] == 404
    assert rec["client_body"] == rec["response_body"]
    assert rec["condition_note"] == "upstream answered 404: passed through unchanged"


@pytest.mark.parametrize(
    "request_kwargs, reason",
    [
        ({"messages": ASK}, "skipped: request offers no function tools"),
        ({"messages": ASK, "tools": []}, "skipped: request offers no function tools"),
        (
            {"messages": ASK, "tools": TOOLS, "tool_choice": "none"},
            "skipped: tool_choice is 'none': the harness asked for no tool call",
        ),
    ],
)
def test_text_skips_requests_it_cannot_apply_to(served, request_kwargs, reason):
    fake, p = served("llamacpp", "--condition", "text")
    fake.enqueue(text("plain"))
    r = client(p).chat.completions.create(model=fake.model, **request_kwargs)
    assert r.choices[0].message.content == "plain"
    [rec] = p.wait_records(1)
    assert rec["condition_note"] == reason and rec["upstream_request"] is None
    assert fake.seen[-1].body == rec["request_body"].encode()  # forwarded byte for byte


async def test_text_skips_non_json_and_other_endpoints(served):
    fake, p = served("llamacpp", "--condition", "text")
    async with aiohttp.ClientSession() as s:
        async with s.post(
            p.url + "/v1/chat/completions", data=b"{oops", headers={"Content-Type": "application/json"}
        ) as r:
            await r.read()
        async with s.get(p.url + "/v1/models") as r:
            assert r.status == 200
    recs = p.wait_records(2)
    assert recs[0]["condition_note"].startswith("skipped: request body is not JSON")
    assert (
        recs[1]["condition_note"]
        == "skipped: GET /v1/models is not a conversation request (/v1/chat/completions or /api/chat or /v1/responses "
        "or /v1/messages or /v1beta/models/MODEL:generateContent)"
    )


def test_condition_by_path_tag_next_to_native(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    p = proxy(fake.url)  # native by default; its own proxy, for addresses without a run tag
    fake.enqueue(call("list_todos", {}), call("list_todos", {}))
    tagged = client(p, "/t/run=exp/condition=text").chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS)
    native = client(p).chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS)
    assert tagged.choices[0].message.tool_calls[0].function.name == "list_todos"
    assert native.choices[0].message.tool_calls[0].function.name == "list_todos"
    assert "tools" not in fake.seen[0].json() and "tools" in fake.seen[1].json()
    recs = p.wait_records(2)
    assert [r["condition"] for r in recs] == ["text", "native"]
    assert recs[1]["upstream_request"] is None and recs[1]["client_body"] is None


# ---------------------------------------------------------------- hint


@pytest.mark.parametrize("stream", [False, True])
def test_hint_injects_the_block_and_leaves_the_response_alone(served, stream):
    fake, p = served("llamacpp", "--condition", "hint")
    fake.enqueue(call("get_weather", {"city": "Oslo"}))
    messages = [{"role": "system", "content": "You are terse."}, *ASK]
    r = client(p).chat.completions.create(model=fake.model, messages=messages, tools=TOOLS, stream=stream)
    if stream:
        _, found, finish, _, _ = stream_message(r)
        assert found[0]["name"] == "get_weather" and finish == "tool_calls"
    else:
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    sent = fake.seen[-1].json()
    assert sent["tools"] == TOOLS
    assert sent["messages"][0] == {"role": "system", "content": "You are terse.\n\n" + render_block(TOOLS)}
    assert sent["messages"][1:] == ASK
    [rec] = p.wait_records(1)
    assert rec["condition"] == "hint" and upstream_body(rec)["messages"][0]["content"].endswith(render_block(TOOLS))
    assert rec["client_body"] is None  # untouched: the client got the upstream bytes


# ---------------------------------------------------------------- constrained


@pytest.mark.parametrize("stack", ["llamacpp", "vllm", "sglang", "lmstudio", "openai", "ollama"])
@pytest.mark.parametrize("stream", [False, True])
def test_constrained_v1_field_per_stack_and_tool_calls(served, stack, stream):
    fake, p = served(stack, "--condition", "constrained", "--stack", stack)
    fake.enqueue(call("get_weather", {"city": "Oslo"}))
    r = client(p).chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS, stream=stream)
    if stream:
        _, found, finish, _, _ = stream_message(r)
        got = [(found[0]["name"], json.loads(found[0]["arguments"]))]
    else:
        finish = r.choices[0].finish_reason
        got = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls]
    assert got == [("get_weather", {"city": "Oslo"})] and finish == "tool_calls"
    sent = fake.seen[-1].json()
    assert sent["response_format"]["type"] == "json_schema"
    schema = sent["response_format"]["json_schema"]["schema"]
    assert {b["properties"].get("name", {}).get("enum", ["<final>"])[0] for b in schema["anyOf"]} == {
        "get_weather",
        "search_files",
        "list_todos",
        "<final>",
    }
    assert not {"tools", "tool_choice", "guided_json", "format"} & set(sent)
    [rec] = p.wait_records(1)
    assert rec["condition_note"] == "schema reply: tool call"


async def test_constrained_ollama_native_uses_format(served):
    fake, p = served("ollama", "--condition", "constrained", "--stack", "ollama")
    fake.enqueue(call("list_todos", {}))
    body = {"model": fake.model, "messages": ASK, "tools": TOOLS, "stream": False}
    async with aiohttp.ClientSession() as s, s.post(p.url + "/api/chat", json=body) as r:
        out = await r.json(content_type=None)
    assert out["message"]["tool_calls"] == [{"function": {"name": "list_todos", "arguments": {}}}]
    sent = fake.seen[-1].json()
    assert "anyOf" in sent["format"] and "response_format" not in sent and "tools" not in sent


def test_constrained_final_answer_ends_the_episode_and_forced_removes_it(served):
    fake, p = served("llamacpp", "--condition", "constrained", "--stack", "llamacpp")
    fake.enqueue(text('{"final_answer": "Oslo is 4 C."}'))
    r = client(p).chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS)
    assert r.choices[0].message.content == "Oslo is 4 C." and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"

    _, forced = served("llamacpp", "--condition", "constrained", "--stack", "llamacpp", "--constrained-forced")
    fake.enqueue(call("list_todos", {}))
    client(forced).chat.completions.create(model=fake.model, messages=ASK, tools=TOOLS)
    schema = fake.seen[-1].json()["response_format"]["json_schema"]["schema"]
    assert all("final_answer" not in b["properties"] for b in schema["anyOf"])
    assert "final_answer" not in fake.seen[-1].json()["messages"][0]["content"]


def test_constrained_history_shows_earlier_calls_as_schema_json(served):
    fake, p = served("vllm", "--condition", "constrained", "--stack", "vllm")
    fake.enqueue(text('{"final_answer": "done"}'))
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4 C"},
    ]
    client(p).chat.completions.create(model=fake.model, messages=messages, tools=TOOLS)
    sent = fake.seen[-1].json()["messages"]
    assert sent[2] == {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'}
    assert sent[3] == {"role": "user", "content": '<tool_result id="c1" name="get_weather">\n4 C\n</tool_result>'}
