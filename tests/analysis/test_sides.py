"""Side requests: what a harness asks for itself beside its task is recorded, counted apart, and no
turn of it. Each is known by its exact shape as the agent's source writes it, and a plain task is
never taken for one (analysis/classify/sides.py)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from proxyprocess import sql_rows, toolproxy_cli

from toolproxy.analysis.classify.sides import (
    SIDES,
    carried_summary,
    opening_keys,
    returned_summary,
    side_request,
    text_key,
)
from toolproxy.emulators import FakeStack, call, text
from toolproxy.wire import family_of, read_request

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
TOOLS = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object"}}}]
CLAUDE_TITLE = (
    "You are a Claude agent, built on Anthropic's Claude Agent SDK.\nGenerate a concise, sentence-case title "
    "(3-7 words) that captures the main topic or goal of this coding session. The title should be clear."
)
COMPACT = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a detailed summary of the "
    "conversation so far, paying close attention to the user's explicit requests and your previous actions."
)


def chat(*messages, tools=None) -> dict:
    return {
        "model": "m",
        "messages": [{"role": r, "content": c} for r, c in messages],
        **({"tools": tools} if tools else {}),
    }


def messages_api(system, *messages, tools=None) -> dict:
    return {
        "model": "m",
        "system": [{"type": "text", "text": system}],
        "max_tokens": 32000,
        "messages": [{"role": r, "content": [{"type": "text", "text": c}]} for r, c in messages],
        **({"tools": [{"name": "Write", "input_schema": {"type": "object"}}]} if tools else {}),
    }


# (case, method, path, body, the kind it is, or None for a request of the task)
CASES = [
    ("inspect-ai's probe", "POST", "/v1/responses", INSPECT_PROBE, "probe"),
    ("the probe streamed", "POST", "/v1/responses", {**INSPECT_PROBE, "stream": True}, "probe"),
    (
        "the probe's words on chat completions",
        "POST",
        "/v1/chat/completions",
        chat(("user", INSPECT_PROBE["input"])),
        None,
    ),
    (
        "the probe's input with tools is a task",
        "POST",
        "/v1/responses",
        {**INSPECT_PROBE, "tools": TASK["tools"]},
        None,
    ),
    (
        "the probe's input without reasoning is a task",
        "POST",
        "/v1/responses",
        {"model": "m", "input": INSPECT_PROBE["input"]},
        None,
    ),
    ("a task", "POST", "/v1/responses", TASK, None),
    ("not an object", "POST", "/v1/responses", ["x"], None),
    (
        "Claude Code's title",
        "POST",
        "/v1/messages",
        messages_api(CLAUDE_TITLE, ("user", "<session>\nfix it\n</session>")),
        "title",
    ),
    (
        "the title prompt with tools is a task",
        "POST",
        "/v1/messages",
        messages_api(CLAUDE_TITLE, ("user", "fix it"), tools=True),
        None,
    ),
    (
        "Claude Code's compaction: the task's conversation and its prompt",
        "POST",
        "/v1/messages",
        messages_api(
            "You are Claude Code.", ("user", "create hello.txt"), ("assistant", "done"), ("user", COMPACT), tools=True
        ),
        "summary",
    ),
    (
        "a user asking for a summary in their own words is a task",
        "POST",
        "/v1/messages",
        messages_api("You are Claude Code.", ("user", "Summarize the conversation so far."), tools=True),
        None,
    ),
    ("Claude Code's preconnect", "HEAD", "/", None, "prewarm"),
    ("a HEAD elsewhere is no known side request", "HEAD", "/v1/models", None, None),
    ("the model list", "GET", "/v1/models", None, "model_list"),
    ("a token count", "POST", "/v1/messages/count_tokens", {"model": "m", "messages": []}, "token_count"),
    (
        "opencode's title",
        "POST",
        "/v1/chat/completions",
        chat(
            ("system", "You are a title generator. You output ONLY a thread title. Nothing else.\n\n<task>"),
            ("user", "Generate a title for this conversation:\n"),
            ("user", "fix it"),
        ),
        "title",
    ),
    (
        "Qwen Code's memory pass (with its tools)",
        "POST",
        "/v1/chat/completions",
        chat(
            ("system", "You are now acting as the managed memory extraction subagent for an AI coding assistant.\n"),
            ("user", "what does git status do?"),
            ("assistant", "It shows changes."),
            ("user", "Managed memory directory: x"),
            tools=TOOLS,
        ),
        "memory",
    ),
    (
        "aider's commit message",
        "POST",
        "/v1/chat/completions",
        chat(
            (
                "system",
                "You are an expert software engineer that generates concise, one-line Git commit messages based on "
                "the provided diffs.",
            ),
            ("user", "# Diffs:\nAdded hello.txt\n"),
        ),
        "commit_message",
    ),
    (
        "a task whose system prompt quotes no side request",
        "POST",
        "/v1/chat/completions",
        chat(
            ("system", "You are a helpful assistant."), ("user", "Generate a concise title for my essay."), tools=TOOLS
        ),
        None,
    ),
    (
        "a plain task without tools",
        "POST",
        "/v1/chat/completions",
        chat(("user", "Write a commit message for my change.")),
        None,
    ),
]


@pytest.mark.parametrize("method,path,body,kind", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_side_request(method, path, body, kind):
    family = family_of(path) if method == "POST" else None
    request = read_request(family, body) if family is not None and isinstance(body, dict) else None
    side = side_request(method, path, body, request.messages if request else (), request.tools if request else None)
    assert (side.kind if side else None) == kind


def test_every_side_request_names_where_its_agent_writes_it():
    """The table is data read from the agents' sources: each entry says whose and where."""
    for side in SIDES:
        assert side.harness and side.where and side.kind
        assert side.path is not None or any(
            (side.system_starts, side.system_has, side.user_starts, side.user_has, side.only_user, side.fields)
        ), side


def test_a_compacted_conversation_is_known_by_the_summary_it_goes_on_from():
    """Claude Code writes its compaction's <summary> after "Summary:" in the next conversation's
    first user message (whitespace aside): both give the same key, and another text gives none."""
    side = side_request("POST", "/v1/messages", None, [{"role": "user", "content": COMPACT}], None)
    reply = "<analysis>thinking</analysis>\n<summary>\n1. The user asked for hello.txt.\n2. It was written.\n</summary>"
    opened = (
        "This session is being continued from a previous conversation that ran out of context. The summary below "
        "covers the earlier portion of the conversation.\n\nSummary:\n1. The user asked for hello.txt.\n2. It was "
        "written.\n\nIf you need specific details from before compaction, read the transcript."
    )
    key = returned_summary(side, reply)
    assert key is not None and carried_summary([{"role": "user", "content": [{"type": "text", "text": opened}]}]) == key
    assert carried_summary([{"role": "user", "content": opened.replace("hello.txt", "bye.txt")}]) != key
    assert carried_summary([{"role": "user", "content": "create hello.txt"}]) is None
    # only the conversation's opening counts: a summary quoted later is no compaction's continuation
    assert (
        carried_summary(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": opened},
            ]
        )
        is None
    )


def test_a_conversation_opens_with_each_text_it_was_given():
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>date</system-reminder>"},
                    {"type": "text", "text": "Create  hello.txt\ncontaining hi."},
                ],
            }
        ]
    }
    assert text_key("Create hello.txt containing hi.") in opening_keys(body)
    assert opening_keys({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}) is None


def _post(url: str, path: str, body: dict) -> None:
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def test_side_requests_are_recorded_counted_apart_and_no_episode(proxy, tmp_path):
    """A probe and a title beside one task: both recorded, neither an attempt nor an episode, and
    the report counts them by kind."""
    fake = FakeStack(
        "llamacpp", replies=[text("hello, world"), text('{"title": "Fix it"}'), call("get_weather", {"city": "Paris"})]
    )
    with fake.in_thread() as url:
        p = proxy(url, "--run", "inspect", "--no-fingerprint", data=tmp_path / "data")
        _post(p.url, "/v1/responses", INSPECT_PROBE)
        _post(p.url, "/v1/messages", messages_api(CLAUDE_TITLE, ("user", "<session>\nfix it\n</session>")))
        _post(p.url, "/v1/responses", TASK)
        p.wait_records(3)
        p.stop()
    assert toolproxy_cli("analyze", "--data", str(tmp_path / "data")).returncode == 0
    rows = sql_rows(tmp_path / "data", "select is_attempt, outcome, side_request from exchanges order by started_at")
    assert rows == [
        {"is_attempt": False, "outcome": None, "side_request": "probe"},
        {"is_attempt": False, "outcome": None, "side_request": "title"},
        {"is_attempt": True, "outcome": "valid_call", "side_request": None},
    ]
    assert sql_rows(tmp_path / "data", "select count(*) as n from episodes") == [{"n": 1}]
    assert sql_rows(tmp_path / "data", "select n_exchanges, n_episodes, n_turns from runs") == [
        {"n_exchanges": 3, "n_episodes": 1, "n_turns": 1}
    ]
    out = toolproxy_cli("report", "--data", str(tmp_path / "data"), "--format", "json")
    (run,) = json.loads(out.stdout)["runs"]
    assert run["side_requests"] == {"probe": 1, "title": 1} and run["episodes"] == 1


def test_a_side_request_toolproxy_does_not_know_is_said_not_placed(proxy, tmp_path):
    """A harness's own request no rule knows (alone, without tools, beside a task with tools): the
    report cannot place it in a task, and says how many such requests it saw."""
    unknown = messages_api("You pick a topic for a chat.", ("user", "fix it"))
    fake = FakeStack("llamacpp", replies=[text("Fixing"), call("get_weather", {"city": "Paris"})])
    with fake.in_thread() as url:
        p = proxy(url, "--run", "agent", "--no-fingerprint", data=tmp_path / "data")
        _post(p.url, "/v1/messages", unknown)
        _post(p.url, "/v1/responses", TASK)
        p.wait_records(2)
        p.stop()
    data = str(tmp_path / "data")
    assert toolproxy_cli("analyze", "--data", data).returncode == 0
    assert sql_rows(tmp_path / "data", "select side_request from exchanges") == [{"side_request": None}] * 2
    (run,) = json.loads(toolproxy_cli("report", "--data", data, "--format", "json").stdout)["runs"]
    assert run["unplaced"] == 1 and run["side_requests"] == {}
    assert "1 request not placed in a task" in toolproxy_cli("report", "--data", data).stdout
