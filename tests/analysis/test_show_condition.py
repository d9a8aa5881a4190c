"""`show` says what a condition did with the stack's reply: turned it into calls, passed it on as
text, or left it alone (it rewrote only the request). It said "before the condition turned it into
tool_calls" for prose that no condition touched."""

from __future__ import annotations

import json
import urllib.request

from proxyprocess import sql_rows, toolproxy_cli

from toolproxy.emulators import FakeStack, text, text_call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _ask(url: str, condition: str) -> None:
    body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    req = urllib.request.Request(
        f"{url}/t/run={condition}/condition={condition.split('-')[0]}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def test_show_says_what_the_condition_did(proxy, tmp_path):
    data = tmp_path / "data"
    fake = FakeStack(
        "llamacpp",
        replies=[
            text_call("hermes", "get_weather", {"city": "Paris"}),  # text: parsed into a call
            text("It is sunny."),  # text: no call in it, passed on as text
            text("It is sunny."),  # hint: the reply is not rewritten at all
        ],
    )
    with fake.in_thread() as url:
        p = proxy(url, "--no-fingerprint", "--quiet", data=data)
        for condition in ("text-call", "text-prose", "hint-prose"):
            _ask(p.url, condition)
        p.wait_records(3)
        p.stop()
    assert toolproxy_cli("analyze", "--data", str(data)).returncode == 0
    ids = {r["run"]: r["id"] for r in sql_rows(data, "select run, id from exchanges")}
    shown = {run: toolproxy_cli("show", "--data", str(data), rid).stdout for run, rid in ids.items()}
    assert "upstream's raw text (before the text condition turned it into 1 tool call):" in shown["text-call"]
    assert (
        "upstream's raw text (the text condition found no call in it and passed it on as text):" in shown["text-prose"]
    )
    assert (
        "the hint condition rewrote only the request: the harness got this reply as the stack sent it"
        in shown["hint-prose"]
    )
    assert all("before the condition turned it into tool_calls" not in s for s in shown.values())
