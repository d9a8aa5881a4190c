"""The turn outcomes (docs/analysis.md), one row per real-world reply: every outcome, every non-response sub-kind."""

from __future__ import annotations

import orjson
import pytest

from toolproxy.analysis.classify.attempt import classify, refusal
from toolproxy.analysis.classify.outcomes import NON_RESPONSE, OUTCOMES, SUB_KINDS
from toolproxy.wire import decode, family_of

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


def chat(content=None, calls=(), finish="stop", **extra) -> bytes:
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    return orjson.dumps({"id": "x", "choices": [{"index": 0, "message": msg, "finish_reason": finish}], **extra})


def err(message, nested=True, **more) -> bytes:
    return orjson.dumps({"error": {"message": message, **more}} if nested else {"error": message})


SSE_ROLE_ONLY = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
SSE_PARTIAL_TEXT = b'data: {"choices":[{"index":0,"delta":{"content":"The weather in"},"finish_reason":null}]}\n\n'

# (id, status, error_kind, path, body, call_surface, outcome, sub_kind, surface, saw_prose)
CASES = [
    # 1. non_response, each sub-kind
    (
        "Ollama 400 model lacks tools",
        400,
        None,
        "/v1/chat/completions",
        err("registry.ollama.ai/library/gemma3:latest does not support tools", type="invalid_request_error"),
        "native",
        NON_RESPONSE,
        "refused",
        None,
        False,
    ),
    (
        "Ollama native 400 string error",
        400,
        None,
        "/api/chat",
        err("registry.ollama.ai/library/gemma3:latest does not support tools", nested=False),
        "native",
        NON_RESPONSE,
        "refused",
        None,
        False,
    ),
    (
        "vLLM default 400 auto tool choice",
        400,
        None,
        "/v1/chat/completions",
        err(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            type="BadRequestError",
            code=400,
        ),
        "native",
        NON_RESPONSE,
        "refused",
        None,
        False,
    ),
    (
        "vLLM 400 tool_choice required unsupported",
        400,
        None,
        "/v1/chat/completions",
        err("tool_choice='required' is not supported", type="BadRequestError", code=400),
        "native",
        NON_RESPONSE,
        "refused",
        None,
        False,
    ),
    (
        "llama.cpp --no-jinja 500 is a refusal",
        500,
        None,
        "/v1/chat/completions",
        err("tools param requires --jinja flag", code=500, type="server_error"),
        "native",
        NON_RESPONSE,
        "refused",
        None,
        False,
    ),
    (
        "Ollama 404 unknown model",
        404,
        None,
        "/api/chat",
        err('model "qwen9" not found, try pulling it first', nested=False),
        "native",
        NON_RESPONSE,
        "http_4xx",
        None,
        False,
    ),
    (
        "400 context length",
        400,
        None,
        "/v1/chat/completions",
        err("This model's maximum context length is 4096 tokens", type="BadRequestError", code=400),
        "native",
        NON_RESPONSE,
        "http_4xx",
        None,
        False,
    ),
    (
        "413 from toolproxy itself",
        413,
        "body_too_large",
        "/v1/chat/completions",
        err("request body is larger than toolproxy's limit"),
        "native",
        NON_RESPONSE,
        "http_4xx",
        None,
        False,
    ),
    (
        "500 out of memory",
        500,
        None,
        "/v1/chat/completions",
        err("CUDA out of memory", type="InternalServerError", code=500),
        "native",
        NON_RESPONSE,
        "http_5xx",
        None,
        False,
    ),
    (
        "llama.cpp 500 parse failure after generation stays http_5xx",
        500,
        None,
        "/v1/chat/completions",
        err('Failed to parse input at pos 12: <tool_call>{"name": "get_weather"', code=500, type="server_error"),
        "native",
        NON_RESPONSE,
        "http_5xx",
        None,
        False,
    ),
    (
        "503 plain text while loading",
        503,
        None,
        "/v1/chat/completions",
        b"Loading model",
        "native",
        NON_RESPONSE,
        "http_5xx",
        None,
        False,
    ),
    (
        "proxy timeout before first byte",
        504,
        "timeout",
        "/v1/chat/completions",
        err("upstream sent no response within 600s", type="toolproxy_error"),
        "native",
        NON_RESPONSE,
        "timeout",
        None,
        False,
    ),
    (
        "idle timeout mid-stream before content",
        200,
        "timeout",
        "/v1/chat/completions",
        SSE_ROLE_ONLY,
        "native",
        NON_RESPONSE,
        "timeout",
        None,
        False,
    ),
    (
        "connection refused",
        502,
        "connect",
        "/v1/chat/completions",
        err("cannot connect to upstream", type="toolproxy_error"),
        "native",
        NON_RESPONSE,
        "connect",
        None,
        False,
    ),
    ("200 with empty body", 200, None, "/v1/chat/completions", b"", "native", NON_RESPONSE, "empty", None, False),
    (
        "200 with empty choices",
        200,
        None,
        "/v1/chat/completions",
        orjson.dumps({"id": "x", "choices": []}),
        "native",
        NON_RESPONSE,
        "empty",
        None,
        False,
    ),
    (
        "Ollama drops a call to an unknown tool: empty content, no calls",
        200,
        None,
        "/v1/chat/completions",
        chat(""),
        "native",
        NON_RESPONSE,
        "empty",
        None,
        False,
    ),
    (
        "output eaten by the server: empty message although 17 completion tokens reported",
        200,
        None,
        "/v1/chat/completions",
        chat("", usage={"prompt_tokens": 40, "completion_tokens": 17, "total_tokens": 57}),
        "native",
        NON_RESPONSE,
        "swallowed",
        None,
        False,
    ),
    (
        "Ollama native: empty message, eval_count says the model ran",
        200,
        None,
        "/api/chat",
        orjson.dumps({"model": "qwen", "message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 9}),
        "native",
        NON_RESPONSE,
        "swallowed",
        None,
        False,
    ),
    (
        "the model's end token first: 1 completion token (llama.cpp under text)",
        200,
        None,
        "/v1/chat/completions",
        chat("", usage={"prompt_tokens": 381, "completion_tokens": 1, "total_tokens": 382}),
        "native",
        NON_RESPONSE,
        "model_stopped",
        None,
        False,
    ),
    (
        "a stop string the harness sent cut the reply (SGLang names it)",
        200,
        None,
        "/v1/chat/completions",
        orjson.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": ""},
                        "finish_reason": "stop",
                        "matched_stop": "Observation:",
                    }
                ]
            }
        ),
        "native",
        NON_RESPONSE,
        "stop_string",
        None,
        False,
    ),
    (
        "empty message with zero completion tokens stays empty",
        200,
        None,
        "/v1/chat/completions",
        chat("", usage={"prompt_tokens": 40, "completion_tokens": 0, "total_tokens": 40}),
        "native",
        NON_RESPONSE,
        "empty",
        None,
        False,
    ),
    (
        "200 but not JSON",
        200,
        None,
        "/v1/chat/completions",
        b"<html>oops</html>",
        "native",
        NON_RESPONSE,
        "empty",
        None,
        False,
    ),
    (
        "the user's Ctrl-C cut the stream before any content",
        200,
        "user_interrupt",
        "/v1/chat/completions",
        SSE_ROLE_ONLY,
        "native",
        NON_RESPONSE,
        "user_interrupt",
        None,
        False,
    ),
    (
        "upstream closed before any content",
        200,
        "upstream_closed",
        "/v1/chat/completions",
        SSE_ROLE_ONLY,
        "native",
        NON_RESPONSE,
        "truncated",
        None,
        False,
    ),
    (
        "stream ended without content or finish",
        200,
        None,
        "/v1/chat/completions",
        SSE_ROLE_ONLY,
        "native",
        NON_RESPONSE,
        "truncated",
        None,
        False,
    ),
    # the client closed the connection first: it gave up waiting (or its user stopped it), not a cut
    (
        "client closed before any content",
        200,
        "client_closed",
        "/v1/chat/completions",
        SSE_ROLE_ONLY,
        "native",
        NON_RESPONSE,
        "client_gave_up",
        None,
        False,
    ),
    (
        "Ollama error event after 200",
        200,
        None,
        "/v1/chat/completions",
        SSE_ROLE_ONLY + b'data: {"error":{"message":"failed to parse JSON","type":"api_error"}}\n\n',
        "native",
        NON_RESPONSE,
        "http_5xx",
        None,
        False,
    ),
    # cut after content: the harness saw text, so it is judged on that text
    (
        "upstream closed after some text",
        200,
        "upstream_closed",
        "/v1/chat/completions",
        SSE_ROLE_ONLY + SSE_PARTIAL_TEXT,
        "native",
        "prose",
        None,
        None,
        False,
    ),
    # 2. hallucinated_call
    (
        "native call to a tool not offered",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_stock_price", '{"ticker":"X"}')], finish="tool_calls"),
        "native",
        "hallucinated_call",
        None,
        "native",
        False,
    ),
    (
        "text call to a tool not offered (SGLang, no parser)",
        200,
        None,
        "/v1/chat/completions",
        chat('<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'),
        "native",
        "hallucinated_call",
        None,
        "text",
        False,
    ),
    (
        "one valid and one hallucinated call: hallucinated wins",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_weather", '{"city":"Oslo"}'), ("book_flight", "{}")], finish="tool_calls"),
        "native",
        "hallucinated_call",
        None,
        "native",
        False,
    ),
    # 3. invalid_args
    (
        "missing required argument",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_weather", '{"days":2}')], finish="tool_calls"),
        "native",
        "invalid_args",
        None,
        "native",
        False,
    ),
    (
        "wrong type",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_weather", '{"city":"Oslo","days":"two"}')], finish="tool_calls"),
        "native",
        "invalid_args",
        None,
        "native",
        False,
    ),
    (
        "extra property with additionalProperties false",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_weather", '{"city":"Oslo","unit":"c"}')], finish="tool_calls"),
        "native",
        "invalid_args",
        None,
        "native",
        False,
    ),
    (
        "text call whose name survives but JSON breaks",
        200,
        None,
        "/v1/chat/completions",
        chat('<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'),
        "native",
        "invalid_args",
        None,
        "text",
        False,
    ),
    (
        "arguments not valid JSON",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_weather", '{"city": "Oslo"')], finish="tool_calls"),
        "native",
        "invalid_args",
        None,
        "native",
        False,
    ),
    # 4. valid_call
    (
        "native valid call",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_weather", '{"city":"Oslo"}')], finish="tool_calls"),
        "native",
        "valid_call",
        None,
        "native",
        False,
    ),
    (
        "Ollama native call with object arguments",
        200,
        None,
        "/api/chat",
        orjson.dumps(
            {
                "model": "q",
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}}],
                },
                "done": True,
            }
        ),
        "native",
        "valid_call",
        None,
        "native",
        False,
    ),
    (
        "SGLang without parser: hermes call in content",
        200,
        None,
        "/v1/chat/completions",
        chat('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', matched_stop=151645),
        "native",
        "valid_call",
        None,
        "text",
        True,
    ),
    (
        "vLLM parser mismatch: fenced JSON in content",
        200,
        None,
        "/v1/chat/completions",
        chat('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'),
        "native",
        "valid_call",
        None,
        "text",
        True,
    ),
    (
        "SGLang finish_reason tool_calls with empty list, call in text",
        200,
        None,
        "/v1/chat/completions",
        chat('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', calls=[], finish="tool_calls"),
        "native",
        "valid_call",
        None,
        "text",
        True,
    ),
    (
        "call only in reasoning_content",
        200,
        None,
        "/v1/chat/completions",
        orjson.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "",
                            "reasoning_content": '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
                        },
                        "finish_reason": "stop",
                    }
                ]
            }
        ),
        "native",
        "valid_call",
        None,
        "text",
        True,
    ),
    (
        "text condition: toolproxy parsed the call into tool_calls",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_weather", '{"city":"Oslo"}')], finish="tool_calls"),
        "text",
        "valid_call",
        None,
        "text",
        False,
    ),
    (
        "constrained condition",
        200,
        None,
        "/v1/chat/completions",
        chat(calls=[("get_weather", '{"city":"Oslo"}')], finish="tool_calls"),
        "constrained",
        "valid_call",
        None,
        "constrained",
        False,
    ),
    # 5. unparseable
    (
        "hermes tag without JSON",
        200,
        None,
        "/v1/chat/completions",
        chat("<tool_call>\nnot json at all\n</tool_call>"),
        "native",
        "unparseable",
        None,
        None,
        False,
    ),
    (
        "hermes tag with JSON that is not a call",
        200,
        None,
        "/v1/chat/completions",
        chat('<tool_call>{"arguments": {"city": "x"}}</tool_call>'),
        "native",
        "unparseable",
        None,
        None,
        False,
    ),
    (
        "Mistral marker with nothing recoverable",
        200,
        None,
        "/v1/chat/completions",
        chat("[TOOL_CALLS] I would call the weather tool now"),
        "native",
        "unparseable",
        None,
        None,
        False,
    ),
    # 6. prose
    (
        "plain answer",
        200,
        None,
        "/v1/chat/completions",
        chat("It is sunny in Oslo."),
        "native",
        "prose",
        None,
        None,
        False,
    ),
    (
        "llama.cpp answer with timings",
        200,
        None,
        "/v1/chat/completions",
        chat("No tool is needed for that.", timings={"cache_n": 10}),
        "native",
        "prose",
        None,
        None,
        False,
    ),
]


@pytest.mark.parametrize(
    "status,error_kind,path,body,call_surface,outcome,sub_kind,surface,saw_prose",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_classify(status, error_kind, path, body, call_surface, outcome, sub_kind, surface, saw_prose):
    reply = decode(body, family_of(path))
    c = classify(reply, status=status, error_kind=error_kind, tools=TOOLS, call_surface=call_surface)
    assert (c.outcome, c.sub_kind, c.surface, c.harness_saw_prose) == (outcome, sub_kind, surface, saw_prose)
    if outcome in ("valid_call", "invalid_args", "hallucinated_call"):
        assert c.calls and all(call.name for call in c.calls)
    if outcome == NON_RESPONSE:
        assert c.calls == []


def test_every_outcome_and_sub_kind_is_covered():
    assert {c[6] for c in CASES} == set(OUTCOMES)
    assert {c[7] for c in CASES if c[7]} == set(SUB_KINDS)


def test_invalid_args_records_schema_errors():
    reply = decode(chat(calls=[("get_weather", '{"days":"x"}')]), "chat")
    call = classify(reply, status=200, error_kind=None, tools=TOOLS).calls[0]
    assert (call.offered, call.validated, call.valid) == (True, True, False)
    assert any("city" in e for e in call.schema_errors) and any("days" in e for e in call.schema_errors)


def test_unusable_tool_schema_means_not_validated_not_a_crash():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "city"}}}]
    c = classify(decode(chat(calls=[("f", "{}")]), "chat"), status=200, error_kind=None, tools=tools)
    assert c.outcome == "valid_call"
    assert (c.calls[0].validated, c.calls[0].valid) == (False, True)


def test_no_reply_at_all():
    assert classify(None, status=None, error_kind="connect", tools=TOOLS).sub_kind == "connect"


REFUSALS = [
    (400, "model does not support tools", True),
    (400, "tool_choice must be auto", True),
    (422, "chat template error: jinja2 undefined", True),
    (400, "maximum context length exceeded", False),
    (413, "request body is larger than toolproxy's limit", False),
    (500, "tools param requires --jinja flag", True),
    (500, "Failed to parse input at pos 3: <tool_call>", False),
    (400, None, False),
]


@pytest.mark.parametrize("status,message,expected", REFUSALS)
def test_refusal(status, message, expected):
    assert refusal(status, message) is expected
