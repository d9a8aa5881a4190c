"""The pure pieces of the conditions, table-driven: tool block, history rewrite, call scanning,
upstream reading, schema, the schema field per stack, completion requests."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import jsonschema
import orjson
import pytest

from toolproxy import wire
from toolproxy.calls import start_markers
from toolproxy.conditions.constrained import ConstrainedReply, call_schema, constraint_fields
from toolproxy.conditions.messages import history_as_text, with_system_text
from toolproxy.conditions.template import completion_request
from toolproxy.conditions.toolblock import format_call, format_result, render_block
from toolproxy.conditions.transform import CallScanner, ReplyTransform, text_calls
from toolproxy.wire.chat import ChatEncoder

DATA = Path(__file__).parent / "data"
TOOLS = json.loads((DATA / "hint_tools.json").read_text())
NAMES = ("get_weather", "search_files", "list_todos")


# ---------------------------------------------------------------- the tool block


def test_hint_block_matches_golden_file():
    assert render_block(TOOLS) == (DATA / "hint_golden.txt").read_text(encoding="utf-8")


def test_show_hint_prints_the_golden_block_byte_for_byte():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "show-hint",
            "--tools",
            str(DATA / "hint_tools.json"),
        ],
        capture_output=True,
        check=True,
    )
    assert out.stdout == (DATA / "hint_golden.txt").read_bytes()


def test_show_hint_accepts_a_request_body_and_rejects_junk(tmp_path):
    body = tmp_path / "req.json"
    body.write_text(json.dumps({"model": "m", "messages": [], "tools": TOOLS}))
    cmd = [sys.executable, "-c", "from toolproxy.cli import main; main()", "show-hint", "--tools"]
    assert (
        subprocess.run([*cmd, str(body)], capture_output=True, check=True).stdout
        == (DATA / "hint_golden.txt").read_bytes()
    )
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    bad = subprocess.run([*cmd, str(junk)], capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read it as JSON" in bad.stderr and "Traceback" not in bad.stderr


def test_taught_call_format_is_what_parse_text_recovers():
    text = "I'll check.\n" + format_call("get_weather", '{"city": "Zürich"}')
    content, calls = text_calls(text, tool_names=NAMES, formats=None)
    assert content == "I'll check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Zürich"})]


@pytest.mark.parametrize(
    "messages, expected_first",
    [
        ([{"role": "user", "content": "hi"}], {"role": "system", "content": "BLOCK"}),
        (
            [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
            {"role": "system", "content": "Be terse.\n\nBLOCK"},
        ),
        ([{"role": "developer", "content": "Be terse."}], {"role": "developer", "content": "Be terse.\n\nBLOCK"}),
        (
            [{"role": "system", "content": [{"type": "text", "text": "Be terse."}]}],
            {
                "role": "system",
                "content": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "\n\nBLOCK"}],
            },
        ),
        ([{"role": "system", "content": ""}], {"role": "system", "content": "BLOCK"}),
    ],
)
def test_with_system_text(messages, expected_first):
    before = json.dumps(messages)
    out = with_system_text(messages, "BLOCK")
    assert out[0] == expected_first
    inserted = messages[0]["role"] not in ("system", "developer")
    assert out[1:] == (messages if inserted else messages[1:])
    assert json.dumps(messages) == before  # the client's request object is not mutated


# ---------------------------------------------------------------- history as text

HISTORY_ROWS = [
    pytest.param(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        ],
        [
            {
                "role": "assistant",
                "content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
            },
            {"role": "user", "content": '<tool_result id="c1" name="get_weather">\n18C\n</tool_result>'},
        ],
        id="openai-one-call",
    ),
    pytest.param(
        [
            {
                "role": "assistant",
                "content": "Checking both.",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "A"},
            {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "B"}]},
            {"role": "user", "content": "thanks"},
        ],
        [
            {
                "role": "assistant",
                "content": 'Checking both.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
                '<tool_call>{"name": "g", "arguments": {"x": 1}}</tool_call>',
            },
            {
                "role": "user",
                "content": '<tool_result id="a" name="f">\nA\n</tool_result>\n<tool_result id="b" '
                'name="g">\nB\n</tool_result>',
            },
            {"role": "user", "content": "thanks"},
        ],
        id="parallel-calls-share-one-user-message",
    ),
    pytest.param(
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
            },
            {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
        ],
        [
            {
                "role": "assistant",
                "content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>',
            },
            {"role": "user", "content": '<tool_result name="get_weather">\nsunny\n</tool_result>'},
        ],
        id="ollama-native-object-arguments-and-tool_name",
    ),
    pytest.param(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{broken"}}],
            }
        ],
        [{"role": "assistant", "content": '<tool_call>{"name": "f", "arguments": "{broken"}</tool_call>'}],
        id="unparseable-arguments-kept-as-sent",
    ),
]


@pytest.mark.parametrize("messages, expected", HISTORY_ROWS)
def test_history_as_text(messages, expected):
    assert history_as_text(messages, format_call, format_result) == expected


# ---------------------------------------------------------------- streaming hold-back

SCAN_ROWS = [
    # (chunks, shown while streaming, final content tail, call names)
    pytest.param(["Hello ", "there, ", "friend."], "Hello there, friend.", "", [], id="prose-streams-through"),
    pytest.param(
        ["Let me look.\n<to", 'ol_call>{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}</tool_call>'],
        "Let me look.\n",
        "",
        ["get_weather"],
        id="marker-split-across-chunks",
    ),
    pytest.param(
        ["Sure <", "b>bold</b> text"], "Sure <b>bold</b> text", "", [], id="a-false-partial-marker-is-released"
    ),
    pytest.param(
        ['<tool_call>{"name": "f", "arguments": {bad}</tool_call>'],
        "",
        '<tool_call>{"name": "f", "arguments": {bad}</tool_call>',
        [],
        id="unparseable-call-stays-content",
    ),
    pytest.param(
        ["Answer: ", '```json\n{"name": "list_todos", "arguments": {}}\n```', " done"],
        "Answer: ",
        "\ndone",
        ["list_todos"],
        id="fenced-json-call",
    ),
]


@pytest.mark.parametrize("chunks, shown, tail, names", SCAN_ROWS)
def test_call_scanner(chunks, shown, tail, names):
    scanner = CallScanner(partial(text_calls, tool_names=NAMES, formats=None), start_markers())
    assert "".join(scanner.feed(c) for c in chunks) == shown
    content, calls = scanner.finish()
    assert content == tail
    assert [c.name for c in calls] == names


def test_scanner_restricted_to_one_parser_streams_other_syntax():
    scanner = CallScanner(partial(text_calls, tool_names=None, formats=("hermes",)), start_markers(("hermes",)))
    assert scanner.feed('Use {"a": 1} and [x]. ') == 'Use {"a": 1} and [x]. '
    assert scanner.feed('<tool_call>{"name": "f", "arguments": {}}</tool_call>') == ""
    assert [c.name for c in scanner.finish()[1]] == ["f"]


# ---------------------------------------------------------------- upstream reading

READER_ROWS = [
    pytest.param(
        wire.CHAT,
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\ndata: [DONE]\n\n',
        "Hi there",
        "stop",
        7,
        id="openai-chat-sse",
    ),
    pytest.param(
        wire.CHAT,
        b'{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}',
        "Hi",
        "length",
        2,
        id="openai-chat-json",
    ),
    pytest.param(
        wire.COMPLETION,
        b'data: {"choices":[{"index":0,"text":"ab"}]}\n\ndata: '
        b'{"choices":[{"index":0,"text":"c","finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n",
        "abc",
        "stop",
        None,
        id="v1-completions-sse",
    ),
    pytest.param(
        wire.COMPLETION,
        b'data: {"content":"x","stop":false}\n\ndata: {"content":"y","stop":false}\n\n'
        b'data: {"content":"","stop":true,"stop_type":"limit","tokens_predicted":2,"tokens_evaluated":9}\n\n',
        "xy",
        "length",
        11,
        id="llamacpp-completion-sse",
    ),
    pytest.param(
        wire.OLLAMA_CHAT,
        b'{"message":{"role":"assistant","content":"O"},"done":false}\n'
        b'{"message":{"role":"assistant","content":"K"},"done":false}\n'
        b'{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}\n',
        "OK",
        "stop",
        5,
        id="ollama-chat-ndjson",
    ),
    pytest.param(
        wire.OLLAMA_GENERATE,
        b'{"model":"m","response":"raw text","done":true,"done_reason":"stop","prompt_eval_count":4,"eval_count":2}',
        "raw text",
        "stop",
        6,
        id="ollama-generate-json",
    ),
]


@pytest.mark.parametrize("family, body, text, finish, total", READER_ROWS)
@pytest.mark.parametrize("chunk_size", [1, 7, 10_000])
def test_upstream_decoder(family, body, text, finish, total, chunk_size):
    decoder = wire.Decoder(family)
    events = [e for i in range(0, len(body), chunk_size) for e in decoder.feed(body[i : i + chunk_size])]
    events += decoder.close()
    assert "".join(e.text for e in events if isinstance(e, wire.Text)) == text
    assert decoder.reply.finish_reason == finish
    assert (decoder.reply.usage or {}).get("total_tokens") == total
    assert decoder.reply.decoded


def test_upstream_decoder_keeps_an_error_event():
    decoder = wire.Decoder(wire.OLLAMA_CHAT)
    assert decoder.feed(b'{"error":"failed to parse JSON: unexpected end"}\n') == [
        wire.Error("failed to parse JSON: unexpected end")
    ]
    assert decoder.reply.error == "failed to parse JSON: unexpected end" and not decoder.reply.decoded


# ---------------------------------------------------------------- constrained


def test_call_schema_accepts_calls_and_final_answer_and_nothing_else():
    schema = call_schema(TOOLS)
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, schema)
    jsonschema.validate({"name": "list_todos", "arguments": {}}, schema)
    jsonschema.validate({"final_answer": "It is sunny."}, schema)
    for bad in (
        {"name": "get_weather", "arguments": {}},  # missing required city
        {"name": "nope", "arguments": {}},
        {"name": "get_weather", "arguments": {"city": 3}},
        {"answer": "x"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_forced_schema_has_no_way_to_stop():
    schema = call_schema(TOOLS, forced=True)
    jsonschema.validate({"name": "list_todos", "arguments": {}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"final_answer": "done"}, schema)


def test_one_tool_forced_schema_is_that_tool_s_branch():
    schema = call_schema(TOOLS[:1], forced=True)
    assert schema["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}


@pytest.mark.parametrize(
    "family, field", [(wire.CHAT, "response_format"), (wire.OLLAMA_CHAT, "format"), (wire.RESPONSES, "text")]
)
def test_constraint_fields(family, field):
    schema = call_schema(TOOLS)
    fields = constraint_fields(family, schema)
    assert list(fields) == [field]
    if field == "response_format":
        assert fields[field] == {
            "type": "json_schema",
            "json_schema": {"name": "tool_call_or_final_answer", "schema": schema},
        }
    elif field == "text":
        assert fields[field] == {
            "format": {"type": "json_schema", "name": "tool_call_or_final_answer", "schema": schema}
        }
    else:
        assert fields[field] == schema


CONSTRAINED_ROWS = [
    pytest.param(
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})], id="call"
    ),
    pytest.param(
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}',
        "",
        [("get_weather", {"city": "Oslo"})],
        id="string-arguments",
    ),
    pytest.param('{"final_answer": "It is 18 C."}', "It is 18 C.", [], id="final-answer"),
    pytest.param(
        'Sure! <tool_call>{"name": "list_todos", "arguments": {}}</tool_call>',
        "Sure!",
        [("list_todos", {})],
        id="schema-not-enforced-text-call-recovered",
    ),
    pytest.param('{"name": "get_weather", "argu', '{"name": "get_weather", "argu', [], id="cut-off-json-is-content"),
]


@pytest.mark.parametrize("reply, content, calls", CONSTRAINED_ROWS)
def test_constrained_reply(reply, content, calls):
    interp = ConstrainedReply(NAMES)
    assert interp.feed(reply) == ""
    got_content, got_calls = interp.finish()
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls


# ---------------------------------------------------------------- template completion requests

COMPLETION_ROWS = [
    pytest.param(
        "llamacpp",
        "/completion",
        wire.COMPLETION,
        {"prompt": "P", "stream": True, "temperature": 0, "stop": ["<|im_end|>"], "n_predict": 64},
        id="llamacpp",
    ),
    pytest.param(
        "ollama",
        "/api/generate",
        wire.OLLAMA_GENERATE,
        {
            "model": "m",
            "prompt": "P",
            "raw": True,
            "stream": True,
            "options": {"temperature": 0, "stop": ["<|im_end|>"], "num_predict": 64},
        },
        id="ollama-raw",
    ),
    pytest.param(
        "vllm",
        "/v1/completions",
        wire.COMPLETION,
        {
            "model": "m",
            "prompt": "P",
            "stream": True,
            "temperature": 0,
            "stop": "<|im_end|>",
            "max_tokens": 64,
            "stream_options": {"include_usage": True},
            "add_special_tokens": False,
        },
        id="vllm",
    ),
    pytest.param(
        "sglang",
        "/v1/completions",
        wire.COMPLETION,
        {
            "model": "m",
            "prompt": "P",
            "stream": True,
            "temperature": 0,
            "stop": "<|im_end|>",
            "max_tokens": 64,
            "stream_options": {"include_usage": True},
        },
        id="sglang",
    ),
    pytest.param(
        None,
        "/v1/completions",
        wire.COMPLETION,
        {
            "model": "m",
            "prompt": "P",
            "stream": True,
            "temperature": 0,
            "stop": "<|im_end|>",
            "max_tokens": 64,
            "stream_options": {"include_usage": True},
        },
        id="unknown-stack",
    ),
]


@pytest.mark.parametrize("stack, path, kind, body", COMPLETION_ROWS)
def test_completion_request(stack, path, kind, body):
    chat = {
        "model": "m",
        "messages": [],
        "temperature": 0,
        "stop": "<|im_end|>",
        "max_tokens": 64,
        "stream": True,
        "tools": TOOLS,
    }
    assert completion_request(stack, "/v1/chat/completions", chat, "P", True) == (path, body, kind)


# ---------------------------------------------------------------- synthesis


def test_openai_stream_synthesis_frames():
    em = ChatEncoder(model="m", stream=True, include_usage=True)
    raw = em.delta("Hi") + em.end("", [wire.Call(0, "call_x", "f", '{"a": 1}')], "stop", {"total_tokens": 3})
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    objs = [orjson.loads(e[6:]) for e in events[:-1]]
    deltas = [o["choices"][0]["delta"] if o["choices"] else None for o in objs]
    assert deltas[:2] == [{"role": "assistant", "content": ""}, {"content": "Hi"}]
    assert deltas[2] == {
        "tool_calls": [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "f", "arguments": ""}}]
    }
    assert deltas[3] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}
    assert objs[4]["choices"][0]["finish_reason"] == "tool_calls"
    assert objs[5]["choices"] == [] and objs[5]["usage"] == {"total_tokens": 3}


@pytest.mark.parametrize(
    "tool_choice, forced_flag, names, forced",
    [
        (None, False, list(NAMES), False),
        ("auto", False, list(NAMES), False),
        ("auto", True, list(NAMES), True),
        ("required", False, list(NAMES), True),
        ({"type": "function", "function": {"name": "list_todos"}}, False, ["list_todos"], True),
        ({"type": "function", "function": {"name": "not_offered"}}, False, list(NAMES), False),
    ],
)
def test_constrained_honours_tool_choice(tool_choice, forced_flag, names, forced):
    from toolproxy.conditions.constrained import required_tools

    tools, got_forced = required_tools(TOOLS, tool_choice, forced_flag)
    assert [t["function"]["name"] for t in tools] == names and got_forced is forced


# ---------------------------------------------------------------- what the harness gets from odd upstream bodies

ODD_UPSTREAM = [
    pytest.param(
        b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\ndata: {"object":"error","message":"worker '
        b'died"}\n\n',
        "text/event-stream",
        None,
        "worker died",
        id="flat-error-event-in-a-200-stream",
    ),
    pytest.param(
        b'{"detail":"Method Not Allowed"}', "application/json", None, "Method Not Allowed", id="fastapi-detail-body"
    ),
    pytest.param(
        b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"two lines"},"finish_reason":"stop"}]}\n\ndata: '
        b"[DONE]\n\n",
        "text/event-stream",
        "two lines",
        None,
        id="multi-line-sse-data",
    ),
    pytest.param(
        b"<html>gateway</html>", "text/html", None, "upstream reply could not be read: body is not JSON", id="html-page"
    ),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("body, ctype, content, error", ODD_UPSTREAM)
def test_text_condition_passes_on_what_upstream_said(body, ctype, content, error, stream):
    scanner = CallScanner(partial(text_calls, tool_names=NAMES, formats=None), start_markers())
    transform = ReplyTransform(wire.Decoder(wire.CHAT), scanner, ChatEncoder(model="m", stream=stream))
    status, headers = transform.start(200, {"Content-Type": ctype})
    out = b"".join(transform.feed(body[i : i + 5]) for i in range(0, len(body), 5)) + transform.finish()
    got = wire.decode(out, wire.CHAT, dict(headers)["Content-Type"])
    assert got.content == content if error is None else (got.error or "").startswith(error)
    if error is not None:
        assert transform.note.startswith(("upstream sent an error event", "upstream reply could not be read"))


# Every opening a parser accepts must hold streaming back; the old restated table missed several.
EVERY_OPENING = [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
    '<TOOLCALL>{"name": "get_weather", "arguments": {"city": "Oslo"}}</TOOLCALL>',
    '<function_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</function_call>',
    "<function=get_weather><parameter=city>Oslo</parameter></function>",
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
    '[TOOL_REQUEST]{"name": "get_weather", "arguments": {"city": "Oslo"}}[END_TOOL_REQUEST]',
    "<start_function_call>call:get_weather{city:<escape>Oslo<escape>}<end_function_call>",
    '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>',
    "<|python_start|>[get_weather(city='Oslo')]<|python_end|>",
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    "[get_weather(city='Oslo')]",
    '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```',
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
]


@pytest.mark.parametrize("call", EVERY_OPENING)
def test_no_call_syntax_streams_before_it_is_parsed(call):
    scanner = CallScanner(partial(text_calls, tool_names=NAMES, formats=None), start_markers())
    text = "Sure. " + call
    shown = "".join(scanner.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    assert shown == "Sure. "
    assert [(c.name, json.loads(c.arguments)) for c in scanner.finish()[1]] == [("get_weather", {"city": "Oslo"})]
