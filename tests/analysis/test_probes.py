"""A harness's capability probe is recorded but is no episode: inspect-ai's `openai/` provider asks
`Please say 'hello, world'` (with reasoning summaries) before its first Responses request."""

from __future__ import annotations

import json
import urllib.request

import pytest
from proxyprocess import sql_rows, toolproxy_cli

from toolproxy.analysis.classify.probes import probe_of
from toolproxy.emulators import FakeStack, call, text

# As inspect-ai 0.3.285 sent it through toolproxy run (examples/recipes/inspect-ai.py openai/local).
INSPECT_PROBE = {
    "model": "local",
    "input": "Please say 'hello, world'",
    "reasoning": {"effort": "low", "summary": "auto"},
}
TASK = {
    "model": "local",
    "input": [{"type": "message", "role": "user", "content": "What is the weather in Paris?"}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
}

CASES = [
    ("inspect-ai's probe", "responses", INSPECT_PROBE, "inspect-ai's reasoning-summaries probe"),
    ("the probe streamed", "responses", {**INSPECT_PROBE, "stream": True}, "inspect-ai's reasoning-summaries probe"),
    (
        "the same words on chat completions",
        "chat",
        {"model": "m", "messages": [{"role": "user", "content": INSPECT_PROBE["input"]}]},
        None,
    ),
    ("the same input with tools is a task", "responses", {**INSPECT_PROBE, "tools": TASK["tools"]}, None),
    ("the same input without reasoning is a task", "responses", {"model": "m", "input": INSPECT_PROBE["input"]}, None),
    ("a task", "responses", TASK, None),
    ("not an object", "responses", ["x"], None),
]


@pytest.mark.parametrize("family,body,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_probe_of(family, body, expected):
    assert probe_of(family, body) == expected


def _post(url: str, body: dict) -> None:
    req = urllib.request.Request(
        url + "/v1/responses", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def test_the_probe_is_recorded_and_no_episode(proxy, tmp_path):
    fake = FakeStack("llamacpp", replies=[text("hello, world"), call("get_weather", {"city": "Paris"})])
    with fake.in_thread() as url:
        p = proxy(url, "--run", "inspect", "--no-fingerprint", data=tmp_path / "data")
        _post(p.url, INSPECT_PROBE)
        _post(p.url, TASK)
        p.wait_records(2)
        p.stop()
    assert toolproxy_cli("analyze", "--data", str(tmp_path / "data")).returncode == 0
    rows = sql_rows(
        tmp_path / "data",
        "select is_attempt, outcome, json_extract_string(record, '$.probe') as probe "
        "from exchanges order by started_at",
    )
    assert rows == [
        {"is_attempt": False, "outcome": None, "probe": "inspect-ai's reasoning-summaries probe"},
        {"is_attempt": True, "outcome": "valid_call", "probe": None},
    ]
    assert sql_rows(tmp_path / "data", "select count(*) as n from episodes") == [{"n": 1}]
    assert sql_rows(tmp_path / "data", "select n_exchanges, n_episodes, n_turns from runs") == [
        {"n_exchanges": 2, "n_episodes": 1, "n_turns": 1}
    ]
