"""Fingerprinting: the pure decision from each stack's exact responses, probing the fakes over HTTP,
and `serve` writing fingerprint records in the background (start + first sight of each model)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import aiohttp
import orjson
import pytest

from toolproxy.checks.doctor import TOOL_MESSAGES, WEATHER_TOOL
from toolproxy.checks.local import local_proxy
from toolproxy.emulators import call
from toolproxy.proxy.stackwatch import model_candidates, top_level_model
from toolproxy.record.segments import read_records
from toolproxy.stacks.fingerprint import (
    LLAMACPP_PROPS,
    LMSTUDIO_V0,
    LMSTUDIO_V1,
    MODELS,
    OLLAMA_SHOW,
    OLLAMA_VERSION,
    ROOT,
    SGLANG_INFO,
    SGLANG_INFO_NEW,
    VLLM_VERSION,
    Observed,
    identify,
    probe,
)

NOT_FOUND = Observed(404, b"404 page not found", {"content-type": "text/plain"})
FASTAPI_404 = Observed(404, b'{"detail":"Not Found"}', {"content-type": "application/json", "server": "uvicorn"})


def ok(body: bytes, **headers: str) -> Observed:
    return Observed(200, body, {"content-type": "application/json", **headers})


# Bodies as each stack writes them (field order and spelling from their sources; values shortened).
OLLAMA = {
    ROOT: Observed(200, b"Ollama is running", {"content-type": "text/plain; charset=utf-8"}),
    OLLAMA_VERSION: ok(b'{"version":"0.12.6"}'),
    MODELS: ok(
        b'{"object":"list","data":[{"id":"qwen2.5:7b","object":"model","created":1750000000,"owned_by":"library"},'
        b'{"id":"gemma3:latest","object":"model","created":1750000000,"owned_by":"library"}]}\n'
    ),
    OLLAMA_SHOW: ok(
        b'{"license":"...","modelfile":"FROM gemma3","parameters":"stop \\"<end_of_turn>\\"",'
        b'"template":"{{- range .Messages }}{{ .Content }}{{ end }}","details":{"parent_model":"","format":"gguf",'
        b'"family":"gemma3","families":["gemma3"],"parameter_size":"4.3B","quantization_level":"Q4_K_M"},'
        b'"model_info":{"general.architecture":"gemma3"},"capabilities":["completion","vision"],'
        b'"modified_at":"2025-09-01T10:00:00Z"}'
    ),
    LLAMACPP_PROPS: NOT_FOUND,
    VLLM_VERSION: NOT_FOUND,
    SGLANG_INFO: NOT_FOUND,
    SGLANG_INFO_NEW: NOT_FOUND,
    LMSTUDIO_V1: NOT_FOUND,
    LMSTUDIO_V0: NOT_FOUND,
}
LLAMA_404 = Observed(
    404,
    b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}',
    {"content-type": "application/json; charset=utf-8", "server": "llama.cpp"},
)
LLAMACPP = {
    ROOT: Observed(200, b"<!doctype html><html>", {"content-type": "text/html", "server": "llama.cpp"}),
    LLAMACPP_PROPS: ok(
        b'{"default_generation_settings":{"params":{},"n_ctx":4096},"total_slots":1,"model_alias":"qwen",'
        b'"model_path":"/m/qwen2.5-coder-0.5b.gguf","modalities":{"vision":false,"video":false,"audio":false},'
        b'"chat_template":"{%- if tools %}...{{ tool | tojson }}...","chat_template_caps":{"supports_tools":true,'
        b'"supports_tool_calls":true,"supports_system_role":true},"bos_token":"","eos_token":"<|im_end|>",'
        b'"build_info":"b6500-3f4b1c2d","is_sleeping":false}',
        server="llama.cpp",
    ),
    MODELS: ok(
        b'{"models":[{"name":"qwen","model":"qwen","capabilities":["completion"]}],"object":"list",'
        b'"data":[{"id":"qwen","object":"model","created":1,"owned_by":"llamacpp","meta":{"n_ctx_train":32768}}]}',
        server="llama.cpp",
    ),
    OLLAMA_VERSION: LLAMA_404,
    VLLM_VERSION: LLAMA_404,
    SGLANG_INFO: LLAMA_404,
    SGLANG_INFO_NEW: LLAMA_404,
    LMSTUDIO_V1: LLAMA_404,
    LMSTUDIO_V0: LLAMA_404,
}
VLLM = {
    VLLM_VERSION: ok(b'{"version":"0.11.0"}', server="uvicorn"),
    MODELS: ok(
        b'{"object":"list","data":[{"id":"Qwen/Qwen2.5-7B-Instruct","object":"model","created":1,"owned_by":"vllm",'
        b'"root":"Qwen/Qwen2.5-7B-Instruct","parent":null,"max_model_len":32768,"permission":[]}]}',
        server="uvicorn",
    ),
    ROOT: FASTAPI_404,
    OLLAMA_VERSION: FASTAPI_404,
    LLAMACPP_PROPS: FASTAPI_404,
    SGLANG_INFO: FASTAPI_404,
    SGLANG_INFO_NEW: FASTAPI_404,
    LMSTUDIO_V1: FASTAPI_404,
    LMSTUDIO_V0: FASTAPI_404,
}
SGLANG_SERVER_INFO = (
    b'{"model_path":"Qwen/Qwen2.5-7B-Instruct","tp_size":1,"tool_call_parser":null,'
    b'"chat_template":null,"internal_states":[{}],"version":"0.5.4"}'
)
SGLANG = {
    SGLANG_INFO: ok(SGLANG_SERVER_INFO, server="uvicorn"),
    SGLANG_INFO_NEW: ok(SGLANG_SERVER_INFO, server="uvicorn"),
    MODELS: ok(
        b'{"object":"list","data":[{"id":"Qwen/Qwen2.5-7B-Instruct","object":"model","created":1,'
        b'"owned_by":"sglang","root":"Qwen/Qwen2.5-7B-Instruct","max_model_len":32768}]}',
        server="uvicorn",
    ),
    ROOT: FASTAPI_404,
    OLLAMA_VERSION: FASTAPI_404,
    LLAMACPP_PROPS: FASTAPI_404,
    VLLM_VERSION: FASTAPI_404,
    LMSTUDIO_V1: FASTAPI_404,
    LMSTUDIO_V0: FASTAPI_404,
}
LMSTUDIO_MODELS_V1 = (
    b'{"models":[{"type":"llm","publisher":"lmstudio-community","key":"qwen2.5-7b-instruct",'
    b'"display_name":"Qwen2.5 7B","loaded_instances":[],"max_context_length":32768,'
    b'"capabilities":{"vision":false,"trained_for_tool_use":true}}]}'
)
LMSTUDIO = {
    LMSTUDIO_V1: ok(LMSTUDIO_MODELS_V1),
    LMSTUDIO_V0: ok(
        b'{"object":"list","data":[{"id":"qwen2.5-7b-instruct","object":"model","type":"llm",'
        b'"publisher":"lmstudio-community","arch":"qwen2","compatibility_type":"gguf",'
        b'"quantization":"Q4_K_M","state":"not-loaded","max_context_length":32768}]}'
    ),
    MODELS: ok(
        b'{"data":[{"id":"qwen2.5-7b-instruct","object":"model","owned_by":"organization_owner"}],"object":"list"}'
    ),
    ROOT: Observed(200, b'{"error":"Unexpected endpoint or method. (GET /)"}'),
    OLLAMA_VERSION: NOT_FOUND,
    LLAMACPP_PROPS: NOT_FOUND,
    VLLM_VERSION: NOT_FOUND,
    SGLANG_INFO: NOT_FOUND,
    SGLANG_INFO_NEW: NOT_FOUND,
}
OPENAI = {
    MODELS: ok(b'{"object":"list","data":[{"id":"gpt-4o-mini","object":"model","created":1,"owned_by":"system"}]}'),
    **{
        k: Observed(404, b'{"error":{"message":"Invalid URL","type":"invalid_request_error"}}')
        for k in (
            ROOT,
            OLLAMA_VERSION,
            LLAMACPP_PROPS,
            VLLM_VERSION,
            SGLANG_INFO,
            SGLANG_INFO_NEW,
            LMSTUDIO_V1,
            LMSTUDIO_V0,
        )
    },
}
NGINX = {
    k: Observed(404, b"<html><body>404 Not Found</body></html>", {"server": "nginx"})
    for k in (ROOT, OLLAMA_VERSION, LLAMACPP_PROPS, VLLM_VERSION, SGLANG_INFO, MODELS)
}
DOWN = {
    k: Observed(None, error="cannot connect to http://127.0.0.1:9: [Errno 111] Connection refused")
    for k in (ROOT, OLLAMA_VERSION, MODELS)
}


@pytest.mark.parametrize(
    "obs, model, stack, version, build, capabilities, listed, template_source",
    [
        (OLLAMA, "gemma3", "ollama", "0.12.6", None, ["completion", "vision"], True, "Ollama POST /api/show template"),
        (
            LLAMACPP,
            "anything",
            "llamacpp",
            "b6500",
            "b6500-3f4b1c2d",
            ["completion", "tools"],
            None,
            "llama.cpp GET /props chat_template",
        ),
        (VLLM, "Qwen/Qwen2.5-7B-Instruct", "vllm", "0.11.0", None, None, True, None),
        (SGLANG, "Qwen/Qwen2.5-7B-Instruct", "sglang", "0.5.4", None, None, True, None),
        ({**SGLANG, SGLANG_INFO: FASTAPI_404}, "Qwen/Qwen2.5-7B-Instruct", "sglang", "0.5.4", None, None, True, None),
        (LMSTUDIO, "qwen2.5-7b-instruct", "lmstudio", None, None, ["completion", "tools"], True, None),
        ({**LMSTUDIO, LMSTUDIO_V1: NOT_FOUND}, "qwen2.5-7b-instruct", "lmstudio", None, None, None, True, None),
        (OPENAI, "gpt-4.1", "openai", None, None, None, False, None),
        (NGINX, "m", "unknown", None, None, None, None, None),
        (DOWN, "m", "unreachable", None, None, None, None, None),
    ],
    ids=[
        "ollama",
        "llamacpp",
        "vllm",
        "sglang",
        "sglang-new-route",
        "lmstudio",
        "lmstudio-v0",
        "openai",
        "unknown",
        "unreachable",
    ],
)
def test_identify_from_exact_responses(obs, model, stack, version, build, capabilities, listed, template_source):
    fp = identify("http://up", obs, model)
    assert (fp.stack, fp.version, fp.build) == (stack, version, build)
    assert fp.capabilities == capabilities
    assert fp.model_listed is listed
    assert fp.chat_template_source == template_source
    assert (fp.chat_template is not None) == (template_source is not None)
    if stack not in ("unknown", "unreachable"):
        assert fp.evidence, "a decision must say what it rests on"
    if stack == "unreachable":
        assert "Connection refused" in fp.error


def test_identify_details_that_decide_advice():
    sg = identify("http://up", SGLANG, "Qwen/Qwen2.5-7B-Instruct")
    assert "tool_call_parser" in sg.details and sg.details["tool_call_parser"] is None
    ll = identify("http://up", LLAMACPP, None)
    assert ll.details["chat_template_caps"]["supports_tool_calls"] is True
    assert ll.details["n_ctx"] == 4096
    ol = identify("http://up", {**OLLAMA, OLLAMA_SHOW: Observed(404, b'{"error":"model \'phi9\' not found"}')}, "phi9")
    assert ol.model_listed is False and ol.capabilities is None
    assert ol.details["show_error"] == "model 'phi9' not found"
    # Ollama names without a tag mean :latest
    assert identify("http://up", OLLAMA, "gemma3:latest").model_listed is True
    assert identify("http://up", OLLAMA, "llama3").model_listed is False


@pytest.mark.parametrize(
    "kind, model, stack, version, capabilities",
    [
        ("ollama", "qwen2.5:7b", "ollama", "0.12.6", ["completion", "tools"]),
        ("ollama", "gemma3", "ollama", "0.12.6", ["completion", "vision"]),
        ("vllm", "Qwen/Qwen2.5-7B-Instruct", "vllm", "0.11.0", None),
        ("sglang", "Qwen/Qwen2.5-7B-Instruct", "sglang", "0.5.4", None),
        ("llamacpp", "qwen2.5-7b-instruct-q4_k_m.gguf", "llamacpp", "b6500", ["completion", "tools"]),
        ("no_jinja", "qwen2.5-7b-instruct-q4_k_m.gguf", "llamacpp", "b6500", ["completion", "tools"]),
        ("lmstudio", "google/gemma-3-4b", "lmstudio", None, ["completion"]),
        ("openai", "gpt-4o-mini", "openai", None, None),
    ],
)
async def test_probe_each_fake_stack_over_http(fake_stack, kind, model, stack, version, capabilities):
    fake = fake_stack(kind)
    async with aiohttp.ClientSession() as session:
        fp = await probe(session, fake.url, model)
    assert (fp.stack, fp.version, fp.capabilities) == (stack, version, capabilities)
    assert fp.upstream == fake.url
    # Probes are read-only (nothing reached a model endpoint) and say who they are.
    assert fake.probes and not fake.seen
    assert not [s for s in fake.probes if s.path.endswith("completions") or s.path in ("/api/chat", "/api/generate")]
    assert all(s.headers["User-Agent"].startswith("toolproxy-fingerprint/") for s in fake.probes)


async def test_probe_unreachable_is_a_result_not_an_exception():
    async with aiohttp.ClientSession() as session:
        fp = await probe(session, "http://127.0.0.1:9", "m", timeout=2.0)
    assert fp.stack == "unreachable" and "cannot connect" in fp.error


@pytest.mark.parametrize(
    "body, candidates, top",
    [
        ('{"model":"qwen2.5:7b","messages":[]}', {"qwen2.5:7b"}, "qwen2.5:7b"),
        ('{"messages":[{"role":"user","content":"hi"}], "model" : "gpt-4o"}', {"gpt-4o"}, "gpt-4o"),
        # a quoted "model" inside a string is escaped, so it is never a candidate
        ('{"model":"a","messages":[{"role":"user","content":"say \\"model\\": \\"b\\""}]}', {"a"}, "a"),
        # a nested key is a candidate, but only the top-level one is the model
        (
            '{"messages":[{"role":"assistant","tool_calls":[]}],"tools":[],"model":"a","metadata":{"model":"nested"}}',
            {"a", "nested"},
            "a",
        ),
        ('{"messages":[]}', set(), None),
        ('{"model": 7}', set(), None),
        ('not json, "model": "x"', {"x"}, None),
    ],
)
def test_model_name_without_parsing(body, candidates, top):
    assert model_candidates(body) == candidates
    assert top_level_model(body) == top


def _fingerprints(data, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        recs = [r for r in read_records(data) if r.get("kind") == "fingerprint"]
        if len(recs) >= n or time.monotonic() > deadline:
            return recs
        time.sleep(0.05)


def test_serve_records_fingerprints_at_start_and_per_new_model(fake_stack, proxy, tmp_path):
    fake = fake_stack("ollama", models={"qwen2.5:7b": ("completion", "tools"), "gemma3:latest": ("completion",)})
    fake.enqueue(call("get_weather", {"city": "Paris"}))
    p = proxy(fake.url, data=tmp_path / "d")
    recs = _fingerprints(p.data, 1)
    assert len(recs) == 1 and recs[0]["extra"]["stack"] == "ollama" and recs[0]["extra"]["model"] is None
    assert recs[0]["extra"]["version"] == "0.12.6"

    def post(model, extra=None):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **(extra or {})}
        req = urllib.request.Request(
            p.url + "/v1/chat/completions", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status

    assert post("qwen2.5:7b", {"metadata": {"model": "not-a-model"}}) == 200
    assert post("qwen2.5:7b") == 200
    assert post("gemma3") == 200
    recs = _fingerprints(p.data, 3)
    by_model = {r["extra"]["model"]: r["extra"] for r in recs}
    assert set(by_model) == {None, "qwen2.5:7b", "gemma3"}, by_model.keys()
    assert by_model["qwen2.5:7b"]["capabilities"] == ["completion", "tools"]
    assert by_model["gemma3"]["capabilities"] == ["completion"]
    assert "range .Messages" in by_model["qwen2.5:7b"]["chat_template"]
    # exchanges are recorded as before, and the stats say which stack it is
    assert len(p.wait_records(3)) == 3
    assert p.stats()["stack"]["stack"] == "ollama"
    time.sleep(0.3)
    assert len([r for r in read_records(p.data) if r.get("kind") == "fingerprint"]) == 3, "one record per model, once"


def test_serve_records_an_unreachable_upstream_and_keeps_serving(proxy, tmp_path):
    p = proxy("http://127.0.0.1:9", data=tmp_path / "d")
    recs = _fingerprints(p.data, 1)
    assert recs[0]["extra"]["stack"] == "unreachable"
    assert recs[0]["error_kind"] == "connect"
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(urllib.request.Request(p.url + "/v1/models"), timeout=10)
    assert exc.value.code == 502
    assert p.health()[0] == 200


@pytest.mark.parametrize("given, expected", [(None, "sglang"), ("vllm", "vllm")])
async def test_serve_fills_condition_stack_from_the_fingerprint(fake_stack, tmp_path, given, expected):
    """--stack not given: each request's condition gets the fingerprinted stack; given: it wins.

    The stack is fixed per request (recorded as extra.dialect); the shared options never change.
    """
    fake = fake_stack("sglang")
    async with local_proxy(fake.url, tmp_path / "d", "t", stack=given) as lp:
        fp = await lp.fingerprint(None)
        assert fp.stack == "sglang"
        probe = await lp.post(
            "/v1/chat/completions",
            {"model": "m", "messages": TOOL_MESSAGES, "tools": [WEATHER_TOOL]},
            condition="constrained",
        )
        assert probe.record is not None and probe.record.extra["dialect"] == expected
        assert lp.state.config.condition_options.stack == given
