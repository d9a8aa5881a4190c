"""OpenTelemetry out: span building as pure functions (tables of records), then a real `toolproxy
serve --otlp-endpoint` in front of an emulated llama.cpp sending to a real OTLP/HTTP receiver
(tests/otlpreceiver.py decodes the exporter's protobuf requests), a receiver that is down, and a
slow one that makes the bounded inbox drop and count."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack

import pytest
from otlpreceiver import Receiver, attributes, send_chat
from proxyprocess import ProxyProcess

from toolproxy import emulators as fakes
from toolproxy.otlp.shipper import EndpointError, SpanShipper, traces_url
from toolproxy.otlp.spans import CONTENT_CHARS, span_of, trace_id_of
from toolproxy.record.model import Record

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
SECRET = "sk-live-0123456789abcdef"


def chat_request(**extra) -> str:
    return json.dumps(
        {
            "model": "qwen",
            "tools": TOOLS,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"}],
            **extra,
        }
    )


CHAT_REPLY = json.dumps(
    {
        "id": "chatcmpl-1",
        "model": "qwen-served",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
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
            }
        ],
        "usage": {
            "prompt_tokens": 31,
            "completion_tokens": 12,
            "total_tokens": 43,
            "prompt_tokens_details": {"cached_tokens": 8},
        },
    }
)
SSE_REPLY = (
    "".join(
        f"data: {json.dumps(obj)}\n\n"
        for obj in (
            {
                "id": "chatcmpl-2",
                "model": "qwen-served",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "It is "}}],
            },
            {
                "id": "chatcmpl-2",
                "model": "qwen-served",
                "choices": [{"index": 0, "delta": {"content": "sunny."}, "finish_reason": "stop"}],
            },
            {
                "id": "chatcmpl-2",
                "model": "qwen-served",
                "choices": [],
                "usage": {"prompt_tokens": 20, "completion_tokens": 3},
            },
        )
    )
    + "data: [DONE]\n\n"
)
MESSAGES_REPLY = json.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}],
        "usage": {"input_tokens": 50, "output_tokens": 9},
    }
)


def record(**fields) -> dict:
    base = {
        "id": "0190aa",
        "kind": "exchange",
        "started_at": 1_800_000_000.25,
        "ended_at": 1_800_000_001.5,
        "ttfb_ms": 300.0,
        "duration_ms": 1250.0,
        "run": "r1",
        "episode": "3",
        "item": "q7",
        "condition": "native",
        "upstream": "http://10.0.0.5:8080",
        "method": "POST",
        "path": "/v1/chat/completions",
        "request_headers": [["authorization", "sha256:ab12cd34"]],
        "request_body": chat_request(),
        "request_body_encoding": "utf8",
        "status": 200,
        "response_headers": [["content-type", "application/json"]],
        "response_body": CHAT_REPLY,
        "response_body_encoding": "utf8",
    }
    return {**base, **fields}


SPAN_CASES = [
    (
        "chat call",
        record(),
        {
            "name": "chat qwen",
            "attrs": {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "qwen",
                "gen_ai.response.model": "qwen-served",
                "gen_ai.response.id": "chatcmpl-1",
                "gen_ai.response.finish_reasons": ["tool_calls"],
                "gen_ai.usage.input_tokens": 31,
                "gen_ai.usage.output_tokens": 12,
                "gen_ai.usage.cache_read.input_tokens": 8,
                "server.address": "10.0.0.5",
                "server.port": 8080,
                "http.response.status_code": 200,
                "toolproxy.run": "r1",
                "toolproxy.episode": "3",
                "toolproxy.item": "q7",
                "toolproxy.condition": "native",
                "toolproxy.exchange_id": "0190aa",
                "toolproxy.ttfb_ms": 300.0,
            },
            "absent": ("error.type", "gen_ai.request.stream", "gen_ai.input.messages"),
            "calls": [("get_weather", "call_1")],
            "error": None,
        },
    ),
    (
        "streamed prose",
        record(
            request_body=chat_request(stream=True, temperature=0, max_tokens=64, seed=7, stop="END"),
            response_headers=[["content-type", "text/event-stream"]],
            response_body=SSE_REPLY,
        ),
        {
            "name": "chat qwen",
            "attrs": {
                "gen_ai.request.stream": True,
                "gen_ai.response.time_to_first_chunk": 0.3,
                "gen_ai.request.temperature": 0.0,
                "gen_ai.request.max_tokens": 64,
                "gen_ai.request.seed": 7,
                "gen_ai.request.stop_sequences": ["END"],
                "gen_ai.response.finish_reasons": ["stop"],
                "gen_ai.usage.input_tokens": 20,
                "gen_ai.usage.output_tokens": 3,
                "gen_ai.response.id": "chatcmpl-2",
            },
            "absent": ("error.type",),
            "calls": [],
            "error": None,
        },
    ),
    (
        "anthropic messages",
        record(
            path="/v1/messages",
            request_body=json.dumps(
                {"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": "Oslo?"}]}
            ),
            response_body=MESSAGES_REPLY,
        ),
        {
            "name": "chat claude-x",
            "attrs": {
                "gen_ai.provider.name": "anthropic",
                "gen_ai.request.max_tokens": 100,
                "gen_ai.response.id": "msg_1",
                "gen_ai.usage.input_tokens": 50,
                "gen_ai.usage.output_tokens": 9,
            },
            "absent": ("error.type",),
            "calls": [("get_weather", "toolu_1")],
            "error": None,
        },
    ),
    (
        "ollama generate",
        record(
            path="/api/generate",
            request_body=json.dumps(
                {"model": "llama3", "prompt": "hi", "stream": False, "options": {"temperature": 0.5, "num_predict": 20}}
            ),
            response_body=json.dumps(
                {
                    "model": "llama3",
                    "response": "hello",
                    "done": True,
                    "done_reason": "stop",
                    "prompt_eval_count": 4,
                    "eval_count": 2,
                }
            ),
        ),
        {
            "name": "text_completion llama3",
            "attrs": {
                "gen_ai.operation.name": "text_completion",
                "gen_ai.provider.name": "ollama",
                "gen_ai.request.temperature": 0.5,
                "gen_ai.request.max_tokens": 20,
            },
            "absent": ("error.type",),
            "calls": [],
            "error": None,
        },
    ),
    (
        "refused with 400",
        record(status=400, response_body=json.dumps({"error": {"message": "tools not supported"}})),
        {
            "name": "chat qwen",
            "attrs": {"error.type": "400", "http.response.status_code": 400},
            "absent": ("gen_ai.response.id",),
            "calls": [],
            "error": "tools not supported",
        },
    ),
    (
        "connect failure",
        record(
            status=None,
            response_body=None,
            response_headers=[],
            error_kind="connect",
            error_message="connection refused",
        ),
        {
            "name": "chat qwen",
            "attrs": {"error.type": "connect"},
            "absent": ("http.response.status_code", "gen_ai.response.model"),
            "calls": [],
            "error": "connection refused",
        },
    ),
    (
        "not a model call",
        record(method="GET", path="/v1/models", request_body=None, response_body='{"data":[]}'),
        {
            "name": "GET /v1/models",
            "attrs": {"http.request.method": "GET", "toolproxy.path": "/v1/models"},
            "absent": ("gen_ai.operation.name", "gen_ai.provider.name"),
            "calls": [],
            "error": None,
        },
    ),
    (
        "body not JSON",
        record(
            request_body="\x00garbage",
            response_body="<html>502</html>",
            status=502,
            response_headers=[["content-type", "text/html"]],
        ),
        {
            "name": "chat",
            "attrs": {"gen_ai.operation.name": "chat", "error.type": "502"},
            "absent": ("gen_ai.request.model",),
            "calls": [],
            "error": "HTTP 502",
        },
    ),
    (
        "condition rewrote the reply",
        record(
            condition="text",
            client_status=200,
            client_body=CHAT_REPLY,
            response_body=json.dumps({"choices": [{"message": {"content": "<tool_call>..."}}]}),
        ),
        {
            "name": "chat qwen",
            "attrs": {"toolproxy.condition": "text", "gen_ai.response.finish_reasons": ["tool_calls"]},
            "absent": (),
            "calls": [("get_weather", "call_1")],
            "error": None,
        },
    ),
]


@pytest.mark.parametrize("rec,want", [c[1:] for c in SPAN_CASES], ids=[c[0] for c in SPAN_CASES])
def test_span_of(rec, want):
    span = span_of(rec)
    assert span.name == want["name"]
    for key, value in want["attrs"].items():
        assert (
            span.attributes.get(key) == pytest.approx(value)
            if isinstance(value, float)
            else span.attributes.get(key) == value
        ), key
    for key in want["absent"]:
        assert key not in span.attributes, key
    assert [(e[2]["gen_ai.tool.name"], e[2].get("gen_ai.tool.call.id")) for e in span.events] == want["calls"]
    assert all(
        name == "toolproxy.tool_call" and "gen_ai.tool.call.arguments" not in attrs for name, _, attrs in span.events
    )
    assert span.error == want["error"]
    assert span.start_ns == 1_800_000_000_250_000_000 and span.end_ns == 1_800_000_001_500_000_000


def test_secrets_and_content_stay_out_unless_asked():
    rec = record()
    plain = span_of(rec)
    text = json.dumps([plain.attributes, plain.events])
    for fragment in ("sha256:ab12cd34", "authorization", "weather in Paris", "be brief", "Paris"):
        assert fragment not in text, fragment
    full = span_of(rec, content=True)
    inputs = json.loads(full.attributes["gen_ai.input.messages"])
    assert inputs == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "weather in Paris?"}]},
    ]
    assert json.loads(full.attributes["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "finish_reason": "tool_calls",
            "parts": [{"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}],
        }
    ]
    assert json.loads(full.attributes["gen_ai.tool.definitions"])[0]["name"] == "get_weather"
    assert full.events[0][2]["gen_ai.tool.call.arguments"] == '{"city":"Paris"}'
    assert "sha256:ab12cd34" not in json.dumps(full.attributes)


def test_history_tool_calls_and_results_in_content():
    body = json.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "x" * (CONTENT_CHARS + 10)},
            ],
        }
    )
    inputs = json.loads(span_of(record(request_body=body), content=True).attributes["gen_ai.input.messages"])
    assert inputs[1] == {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": "c1", "name": "f", "arguments": {"a": 1}}],
    }
    assert inputs[2]["parts"][0]["type"] == "tool_call_response" and inputs[2]["parts"][0]["id"] == "c1"
    assert inputs[2]["parts"][0]["response"].endswith(f"... ({CONTENT_CHARS + 10:,} characters in all)")


def test_hostile_values_still_make_a_span():
    rec = record(
        run="r\udcff1",
        episode=None,
        request_body=json.dumps({"model": 5, "temperature": True, "stop": [1, 2], "messages": "no"}),
        response_body='{"choices": "nope", "model": ["x"], "id": {"a": 1}}',
        ttfb_ms="soon",
        started_at=None,
    )
    span = span_of(rec, content=True)
    assert span.attributes["toolproxy.run"] == "r?1"
    assert span.name == "chat"
    for key in (
        "gen_ai.request.temperature",
        "gen_ai.request.stop_sequences",
        "gen_ai.response.model",
        "gen_ai.response.id",
    ):
        assert key not in span.attributes, key
    assert "toolproxy.ttfb_ms" not in span.attributes


def test_ids_are_derived_one_trace_per_tagged_episode():
    a, b = record(id="a1"), record(id="a2")
    assert trace_id_of(a) == trace_id_of(b) != trace_id_of(record(id="a1", episode="4"))
    untagged = [record(id=i, episode=None) for i in ("u1", "u2")]
    assert trace_id_of(untagged[0]) != trace_id_of(untagged[1])
    assert span_of(a).span_id == span_of(record(id="a1")).span_id != span_of(b).span_id
    assert all(0 < s.trace_id < 2**128 and 0 < s.span_id < 2**64 for s in (span_of(a), span_of(untagged[0])))


@pytest.mark.parametrize(
    "given,url",
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://phoenix.example/v1/traces", "https://phoenix.example/v1/traces"),
        ("http://h:6006/custom/path", "http://h:6006/custom/path"),
    ],
)
def test_traces_url(given, url):
    assert traces_url(given) == url


@pytest.mark.parametrize("bad", ["127.0.0.1:4318", "ftp://x/", "http://", ""])
def test_traces_url_refuses(bad):
    with pytest.raises(EndpointError):
        traces_url(bad)


# ---- a real proxy, a real receiver ------------------------------------------------------------

SCRIPT = {
    "weather": fakes.call("get_weather", {"city": "Paris"}),
    "chat": fakes.text("Just chatting."),
    "oom": fakes.error(500, "out of memory"),
}


def send(url: str, prompt: str, run: str, episode: str, stream: bool = False) -> int:
    return send_chat(url, prompt, run=run, episode=episode, model="qwen", tools=TOOLS, secret=SECRET, stream=stream)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """One proxy sending to one receiver, with a call, prose (streamed) and an upstream failure."""
    with ExitStack() as stack:
        fake = fakes.FakeStack("llamacpp", responder=lambda req: SCRIPT[req.messages[-1]["content"]])
        stack.enter_context(fake.in_thread())
        receiver = stack.enter_context(Receiver())
        p = ProxyProcess(fake.url, tmp_path_factory.mktemp("otlp"), ("--otlp-endpoint", receiver.url, "--quiet"))
        stack.callback(p.stop)
        statuses = [
            send(p.url, "weather", "alpha", "1"),
            send(p.url, "chat", "alpha", "1", stream=True),
            send(p.url, "oom", "beta", "2"),
        ]
        yield p, receiver, statuses


def test_serve_sends_one_span_per_exchange(traced):
    p, receiver, statuses = traced
    assert statuses == [200, 200, 500]
    spans = receiver.wait_for(3)
    assert len(spans) == 3
    by_id = {attributes(s)["toolproxy.exchange_id"]: s for s in spans}
    records = {r["id"]: r for r in p.records() if r["kind"] == "exchange"}
    assert set(by_id) == set(records)
    call, prose, failed = (by_id[r["id"]] for r in sorted(records.values(), key=lambda r: r["id"]))
    for span in spans:
        a = attributes(span)
        assert span["kind"] == "SPAN_KIND_CLIENT" and span["name"] == "chat qwen"
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
        assert a["toolproxy.stack"] == "llamacpp" and a["server.address"] == "127.0.0.1"
        assert span["resource"]["service.name"] == {"stringValue": "toolproxy"}
    assert attributes(call)["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert [e["name"] for e in call["events"]] == ["toolproxy.tool_call"]
    assert {a["key"]: a["value"] for a in call["events"][0]["attributes"]}["gen_ai.tool.name"] == {
        "stringValue": "get_weather"
    }
    assert attributes(prose)["gen_ai.request.stream"] is True and "events" not in prose
    assert attributes(failed)["error.type"] == "500" and failed["status"]["code"] == "STATUS_CODE_ERROR"
    assert "out of memory" in failed["status"]["message"]
    # one trace per tagged episode
    assert call["traceId"] == prose["traceId"] != failed["traceId"]
    rec = records[attributes(call)["toolproxy.exchange_id"]]
    start = int(call["startTimeUnixNano"])
    assert abs(start - rec["started_at"] * 1e9) < 1e3 and int(call["endTimeUnixNano"]) >= start


def test_serve_spans_never_carry_secrets_or_content(traced):
    _, receiver, _ = traced
    text = json.dumps(receiver.wait_for(3))
    for fragment in (SECRET, "Bearer", "Just chatting", "Paris", "gen_ai.input.messages"):
        assert fragment not in text, fragment


def test_serve_stats_count_exported(traced):
    p, receiver, _ = traced
    receiver.wait_for(3)
    deadline = time.monotonic() + 120
    while (otlp := p.stats()["otlp"])["exported"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert otlp["observed"] == otlp["exported"] == 3
    assert otlp["dropped"] == otlp["failed"] == otlp["unbuilt"] == 0 and otlp["endpoint"] == receiver.url + "/v1/traces"


def test_receiver_down_never_slows_forwarding(fake_stack, proxy, unused_tcp_port):
    fake = fake_stack("llamacpp", responder=lambda req: SCRIPT[req.messages[-1]["content"]])
    p = proxy(fake.url, "--otlp-endpoint", f"http://127.0.0.1:{unused_tcp_port}", "--quiet")
    started = time.monotonic()
    assert [send(p.url, "weather", "r", str(i)) for i in range(5)] == [200] * 5
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 120
    while (otlp := p.stats()["otlp"])["observed"] < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert otlp["observed"] == 5 and otlp["exported"] == 0, otlp
    started = time.monotonic()
    p.stop()  # the exporter is still retrying: shutting down cuts that short
    assert time.monotonic() - started < 10
    assert "Traceback" not in p.output() and "Failed to export" not in p.output()
    assert len([r for r in p.records() if r["kind"] == "exchange"]) == 5


def test_refused_spans_are_counted_failed_with_the_reason():
    with Receiver() as receiver:
        shipper = SpanShipper(receiver.url + "/not-traces", interval=0.05)
        shipper.start()
        for i in range(3):
            shipper.observe(Record(**record(id=f"f{i}")))
        deadline = time.monotonic() + 120
        while shipper.report()["failed"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        shipper.stop()
        r = shipper.report()
        assert r["failed"] == 3 and r["exported"] == 0 and "404" in r["last_error"], r


def test_slow_receiver_fills_the_inbox_and_drops_are_counted():
    """The SpanShipper the proxy runs, with a small inbox, against a receiver that takes 2 s a request."""
    with Receiver(delay=2.0) as receiver:
        shipper = SpanShipper(receiver.url, inbox=4, batch=2, interval=0.05, timeout=10)
        shipper.start()
        recs = [Record(**record(id=f"x{i}")) for i in range(20)]
        started = time.monotonic()
        for rec in recs:
            shipper.observe(rec)
        assert time.monotonic() - started < 0.5  # observing never waits for the receiver
        shipper.stop(timeout=15)
        r = shipper.report()
        assert r["observed"] == 20 and r["dropped"] > 0
        assert r["exported"] + r["dropped"] + r["failed"] == 20, r
        assert len(receiver.spans) == r["exported"]


def test_usage_errors(tmp_path):
    base = [
        sys.executable,
        "-c",
        "from toolproxy.cli import main; main()",
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--data",
        str(tmp_path),
    ]
    for args, message in (
        (["--otlp-endpoint", "collector:4318"], "must be an http(s) URL"),
        (["--otlp-content"], "--otlp-content needs --otlp-endpoint"),
    ):
        out = subprocess.run(base + args, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def toolproxy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_export_after_analyze_carries_the_verdicts(traced):
    p, receiver, _ = traced
    served_spans = {s["spanId"]: s for s in receiver.wait_for(3)}
    out = toolproxy("analyze", "--data", str(p.data), "--quiet")
    assert out.returncode == 0, out.stderr
    with Receiver() as second:
        out = toolproxy("export", "--data", str(p.data), "--otlp", second.url, "--quiet")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"otlp: 3 spans sent to {second.url}/v1/traces; 3 analysed exchanges read" in out.stdout
        spans = second.wait_for(3)
    # its own span ids (a receiver keeps the first span under an id), linked to the live spans, in their traces
    links = {s["links"][0]["spanId"]: s for s in spans}
    assert set(links) == set(served_spans) and not {s["spanId"] for s in spans} & set(served_spans)
    by_prompt = {}
    for span in spans:
        a = attributes(span)
        assert (
            a["toolproxy.turn.final"] is True
            and a["toolproxy.turn.attempts"] == 1
            and a["toolproxy.analyzer_version"] >= 1
        )
        assert a["gen_ai.conversation.id"] and a["toolproxy.turn.id"]
        assert span["traceId"] == span["links"][0]["traceId"] == served_spans[span["links"][0]["spanId"]]["traceId"]
        by_prompt[
            (
                a["toolproxy.outcome"],
                a.get("toolproxy.sub_kind"),
                a.get("toolproxy.surface"),
                a.get("toolproxy.turn.role"),
            )
        ] = span
    assert set(by_prompt) == {
        ("valid_call", None, "native", "call"),
        ("prose", None, None, "open"),
        ("non_response", "http_5xx", None, None),
    }, set(by_prompt)
    call = by_prompt[("valid_call", None, "native", "call")]
    event = {a["key"]: a["value"] for a in call["events"][0]["attributes"]}
    assert event["toolproxy.call.valid"] == {"boolValue": True} and event["toolproxy.call.offered"] == {
        "boolValue": True
    }
    assert event["gen_ai.tool.name"] == {"stringValue": "get_weather"} and "gen_ai.tool.call.id" in event
    assert "gen_ai.tool.call.arguments" not in event
    with Receiver() as third:
        out = toolproxy("export", "--data", str(p.data), "--otlp", third.url, "--run", "beta", "--quiet")
        assert out.returncode == 0 and "otlp: 1 spans sent" in out.stdout, out.stdout + out.stderr
        (again,) = third.wait_for(1)
        assert attributes(again)["toolproxy.run"] == "beta"
        assert again["spanId"] in {s["spanId"] for s in spans}  # exporting again sends the same ids


def test_export_says_what_is_missing(tmp_path):
    out = toolproxy("export", "--data", str(tmp_path), "--otlp", "http://127.0.0.1:9")
    assert out.returncode == 2 and "holds no recordings" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "segments").mkdir()
    out = toolproxy("export", "--data", str(tmp_path), "--otlp", "http://127.0.0.1:9")
    assert out.returncode == 2 and "run `toolproxy analyze" in out.stderr, out.stderr
    out = toolproxy("export", "--data", str(tmp_path), "--otlp", "collector")
    assert out.returncode == 2 and "must be an http(s) URL" in out.stderr, out.stderr


def test_content_flag_sends_masked_content(fake_stack, proxy):
    """--otlp-content puts the conversation on the span, built from the record as masked for disk."""
    fake = fake_stack("llamacpp", responder=lambda req: fakes.text("Noted."))
    with Receiver() as receiver:
        p = proxy(fake.url, "--otlp-endpoint", receiver.url, "--otlp-content", "--mask", "email", "--quiet")
        req = urllib.request.Request(
            p.url + "/v1/chat/completions",
            data=json.dumps(
                {"model": "qwen", "messages": [{"role": "user", "content": "mail ada@example.com the report"}]}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=20) as r:
            r.read()
        (span,) = receiver.wait_for(1)
    a = attributes(span)
    inputs = json.loads(a["gen_ai.input.messages"])
    assert inputs[0]["role"] == "user" and "ada@example.com" not in a["gen_ai.input.messages"]
    assert inputs[0]["parts"][0]["content"].startswith("mail masked:")
    assert json.loads(a["gen_ai.output.messages"])[0]["parts"] == [{"type": "text", "content": "Noted."}]
