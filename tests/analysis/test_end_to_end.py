"""The real proxy in front of the fake stacks, then `toolproxy analyze` on what it recorded.

Each run reproduces a behaviour the project exists to tell apart (turn outcomes and stack behaviours): a stack
that refuses tools, one that leaves the call in text, a model whose stack refuses it, a model that
invents a tool, and a server that keeps failing until the client gives up.
"""

from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest

from toolproxy.emulators import call, text

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def client(proxy_url: str, run: str, episode: int, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy_url}/t/run={run}/episode={episode}/v1", api_key="sk-test", max_retries=retries, timeout=30
    )


def ask(c: openai.OpenAI, model: str, stream: bool = False, content: str = "Weather in Oslo?"):
    messages = [{"role": "user", "content": content}]
    if stream:
        return list(c.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True))
    return c.chat.completions.create(model=model, messages=messages, tools=TOOLS)


def tp(*args):
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def sql(data, query):
    r = tp("sql", "--data", str(data), "--format", "json", query)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def recorded(fake_stack, proxy, tmp_path):
    data = tmp_path / "data"
    n_expected = 0

    # vLLM without --enable-auto-tool-choice: HTTP 400 before the model runs
    p = proxy(fake_stack("vllm").url, "--durability", "sync", data=data)
    for ep in range(3):
        with pytest.raises(openai.BadRequestError):
            ask(client(p.url, "vllm-default", ep), "Qwen/Qwen2.5-7B-Instruct", stream=ep == 2)
    n_expected += 3
    p.stop()

    # SGLang without --tool-call-parser: 200, the call stays in content as hermes text
    fake = fake_stack("sglang").enqueue(*[call("get_weather", {"city": "Oslo"})] * 3)
    p = proxy(fake.url, "--durability", "sync", data=data)
    for ep in range(3):
        out = ask(client(p.url, "sglang-noparser", ep), "Qwen/Qwen2.5-7B-Instruct", stream=ep == 1)
        if ep != 1:
            assert out.choices[0].message.tool_calls is None and "<tool_call>" in out.choices[0].message.content
    n_expected += 3
    p.stop()

    # Ollama with a model whose capabilities lack "tools": 400 "does not support tools"
    p = proxy(fake_stack("ollama").url, "--durability", "sync", data=data)
    for ep in range(2):
        with pytest.raises(openai.BadRequestError):
            ask(client(p.url, "ollama-gemma", ep), "gemma3:latest")
    n_expected += 2
    p.stop()

    # An OpenAI-style server whose model calls a tool that was never offered
    fake = fake_stack("openai").enqueue(
        call("get_stock_price", {"ticker": "ACME"}), call("get_weather", {"city": "Oslo"})
    )
    p = proxy(fake.url, "--durability", "sync", data=data)
    ask(client(p.url, "openai-halluc", 0), "gpt-4o-mini")
    ask(client(p.url, "openai-halluc", 1), "gpt-4o-mini", stream=True)
    n_expected += 2
    p.stop()

    # A server that answers 500 to every try: the SDK retries twice, then gives up
    fake = fake_stack("vllm", tool_parser="hermes").fail(times=3, status=500)
    p = proxy(fake.url, "--durability", "sync", "--run", "vllm-500", data=data)
    c = openai.OpenAI(base_url=f"{p.url}/v1", api_key="sk-test", max_retries=2, timeout=30)
    with pytest.raises(openai.InternalServerError):
        c.chat.completions.create(
            model="Qwen/Qwen2.5-7B-Instruct", messages=[{"role": "user", "content": "hi"}], tools=TOOLS
        )
    n_expected += 3
    fake.enqueue(text("Plain answer, no tool needed."))
    c.chat.completions.create(
        model="Qwen/Qwen2.5-7B-Instruct", messages=[{"role": "user", "content": "thanks"}], tools=TOOLS
    )
    n_expected += 1
    p.stop()

    r = tp("analyze", "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert f"new exchanges: {n_expected}" in r.stdout and "issues: none" in r.stdout, r.stdout
    return data


def test_end_to_end(recorded):
    data = recorded
    outcomes = sql(
        data,
        "SELECT run, outcome, sub_kind, surface, harness_saw_prose, n_attempts, count(*) AS n "
        "FROM turns GROUP BY ALL ORDER BY run, outcome, n_attempts",
    )
    assert outcomes == [
        {
            "run": "ollama-gemma",
            "outcome": "non_response",
            "sub_kind": "refused",
            "surface": None,
            "harness_saw_prose": False,
            "n_attempts": 1,
            "n": 2,
        },
        {
            "run": "openai-halluc",
            "outcome": "hallucinated_call",
            "sub_kind": None,
            "surface": "native",
            "harness_saw_prose": False,
            "n_attempts": 1,
            "n": 1,
        },
        {
            "run": "openai-halluc",
            "outcome": "valid_call",
            "sub_kind": None,
            "surface": "native",
            "harness_saw_prose": False,
            "n_attempts": 1,
            "n": 1,
        },
        {
            "run": "sglang-noparser",
            "outcome": "valid_call",
            "sub_kind": None,
            "surface": "text",
            "harness_saw_prose": True,
            "n_attempts": 1,
            "n": 3,
        },
        {
            "run": "vllm-500",
            "outcome": "non_response",
            "sub_kind": "http_5xx",
            "surface": None,
            "harness_saw_prose": False,
            "n_attempts": 3,
            "n": 1,
        },
        {
            "run": "vllm-500",
            "outcome": "prose",
            "sub_kind": None,
            "surface": None,
            "harness_saw_prose": False,
            "n_attempts": 1,
            "n": 1,
        },
        {
            "run": "vllm-default",
            "outcome": "non_response",
            "sub_kind": "refused",
            "surface": None,
            "harness_saw_prose": False,
            "n_attempts": 1,
            "n": 3,
        },
    ]
    runs = {r["run"]: r for r in sql(data, "SELECT run, stack, n_episodes, n_turns, n_exchanges FROM runs")}
    # The OpenAI fake leaves no marks in its bodies; serve's fingerprint record (it answers
    # /v1/models and nothing stack-specific) names it "openai", an OpenAI-compatible server.
    assert {k: v["stack"] for k, v in runs.items()} == {
        "vllm-default": "vllm",
        "sglang-noparser": "sglang",
        "ollama-gemma": "ollama",
        "openai-halluc": "openai",
        "vllm-500": "vllm",
    }
    assert runs["vllm-500"]["n_exchanges"] == 4 and runs["vllm-500"]["n_turns"] == 2
    calls = sql(
        data,
        "SELECT c.name, c.surface, c.format, c.offered, c.valid FROM calls c JOIN turns t USING (turn_id) "
        "WHERE t.run IN ('sglang-noparser', 'openai-halluc') ORDER BY t.run, c.name",
    )
    assert (
        calls
        == [
            {"name": "get_stock_price", "surface": "native", "format": "tool_calls", "offered": False, "valid": False},
            {"name": "get_weather", "surface": "native", "format": "tool_calls", "offered": True, "valid": True},
        ]
        + [{"name": "get_weather", "surface": "text", "format": "hermes", "offered": True, "valid": True}] * 3
    )
    # re-running adds nothing
    r = tp("analyze", "--data", str(data))
    assert r.returncode == 0 and "new exchanges: 0" in r.stdout
    retry_id = sql(data, "SELECT final_exchange_id AS id FROM turns WHERE n_attempts = 3")[0]["id"]
    r = tp("show", "--data", str(data), retry_id)
    assert r.returncode == 0 and "non_response/http_5xx after 3 attempt(s)" in r.stdout
