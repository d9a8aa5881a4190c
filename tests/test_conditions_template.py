"""template: a real Qwen2.5 chat template rendered as transformers/llama.cpp render it, sent to each
stack's raw completion endpoint through the real proxy, answered as a standard chat response."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import orjson
import pytest

from toolproxy.conditions.chat_template import TemplateError, load_template
from toolproxy.emulators import call, text

DATA = Path(__file__).parent / "data"
QWEN = DATA / "qwen2.5" / "tokenizer_config.json"
CONVERSATION = json.loads((DATA / "qwen2.5" / "conversation.json").read_text())
GOLDEN = (DATA / "qwen2.5" / "prompt_golden.txt").read_text(encoding="utf-8")


def client(p) -> openai.OpenAI:
    return openai.OpenAI(base_url=p.url + "/v1", api_key="sk-test", max_retries=0)


def test_qwen25_template_renders_the_known_prompt():
    prompt = load_template(QWEN).render(CONVERSATION["messages"], CONVERSATION["tools"])
    assert prompt == GOLDEN


@pytest.mark.parametrize(
    "source, expected",
    [
        pytest.param(
            "{{ bos_token }}{% for m in messages %}{{ m.content | tojson }}{% endfor %}",
            '<s>"Zürich <b>"',
            id="tojson-unescaped-unicode-and-html",
        ),
        pytest.param(
            "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content }}{% endfor %}",
            "",
            id="loop-controls",
        ),
        pytest.param("{% generation %}{{ messages[0].content }}{% endgeneration %}", "Zürich <b>", id="generation-tag"),
        pytest.param("{{ strftime_now('%Y') | length }}", "4", id="strftime_now"),
        pytest.param("{{ {'b': 1, 'a': 2} | tojson }}", '{"b": 1, "a": 2}', id="tojson-keeps-key-order"),
    ],
)
def test_hf_template_features(tmp_path, source, expected):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": source, "bos_token": {"content": "<s>", "lstrip": False}}))
    assert load_template(path).render([{"role": "user", "content": "Zürich <b>"}], None).rstrip() == expected


def test_named_templates_pick_tool_use_when_tools_are_offered(tmp_path):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "default", "template": "plain"},
                    {"name": "tool_use", "template": "tools:{{ tools | length }}"},
                ]
            }
        )
    )
    t = load_template(path)
    assert t.render([], None) == "plain" and t.render([], [{"type": "function"}]) == "tools:1"


@pytest.mark.parametrize(
    "content, message",
    [
        ("{% if %}", "syntax error at line 1"),
        ('{"no_template": 1}', "no 'chat_template' string"),
    ],
)
def test_bad_template_files_are_named_errors(tmp_path, content, message):
    path = tmp_path / ("t.jinja" if content.startswith("{%") else "tokenizer_config.json")
    path.write_text(content)
    with pytest.raises(TemplateError, match=message):
        load_template(path)


def test_sandbox_blocks_attribute_escapes(tmp_path):
    path = tmp_path / "evil.jinja"
    path.write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError, match="failed to render"):
        load_template(path).render([], None)


@pytest.mark.parametrize(
    "stack, path",
    [
        ("llamacpp", "/completion"),
        ("vllm", "/v1/completions"),
        ("ollama", "/api/generate"),
        ("sglang", "/v1/completions"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_template_through_the_proxy(fake_stack, proxy, stack, path, stream):
    fake = fake_stack(stack)
    fake.enqueue(call("book_train", {"origin": "Paris", "destination": "Zürich", "date": "2026-05-02"}))
    p = proxy(fake.url, "--condition", "template", "--stack", stack, "--chat-template", str(QWEN), "--parser", "hermes")
    r = client(p).chat.completions.create(
        model=fake.model, messages=CONVERSATION["messages"], tools=CONVERSATION["tools"], stream=stream, temperature=0
    )
    if stream:
        got, finish = {}, None
        for chunk in r:
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or []:
                    slot = got.setdefault(tc.index, ["", ""])
                    slot[0] += tc.function.name or ""
                    slot[1] += tc.function.arguments or ""
                finish = choice.finish_reason or finish
        calls = [(name, json.loads(args)) for name, args in got.values()]
    else:
        finish = r.choices[0].finish_reason
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls]
    assert calls == [("book_train", {"origin": "Paris", "destination": "Zürich", "date": "2026-05-02"})]
    assert finish == "tool_calls"
    seen = fake.seen[-1]
    assert seen.path == path
    sent = seen.json()
    assert sent["prompt"] == GOLDEN
    assert "messages" not in sent and "tools" not in sent
    if stack == "ollama":
        assert sent["raw"] is True and sent["options"] == {"temperature": 0}
    [rec] = p.wait_records(1)
    assert rec["condition"] == "template" and rec["upstream_request"]["path"] == path
    assert orjson.loads(rec["upstream_request"]["body"])["prompt"] == GOLDEN


def test_template_reply_without_calls_is_plain_content(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    fake.enqueue(text("Which day should I book?"))
    p = proxy(fake.url, "--condition", "template", "--stack", "llamacpp", "--chat-template", str(QWEN))
    r = client(p).chat.completions.create(
        model=fake.model, messages=CONVERSATION["messages"], tools=CONVERSATION["tools"]
    )
    assert r.choices[0].message.content == "Which day should I book?" and r.choices[0].finish_reason == "stop"


def test_template_render_failure_is_a_recorded_400(fake_stack, proxy, tmp_path):
    strict = tmp_path / "strict.jinja"
    strict.write_text(
        "{% for m in messages %}{% if m.role == 'tool' %}"
        "{{ raise_exception('tool messages are not supported by this template') }}{% endif %}{% endfor %}"
    )
    fake = fake_stack("vllm")
    p = proxy(fake.url, "--condition", "template", "--stack", "vllm", "--chat-template", str(strict))
    with pytest.raises(openai.BadRequestError) as info:
        client(p).chat.completions.create(
            model=fake.model, messages=CONVERSATION["messages"], tools=CONVERSATION["tools"]
        )
    assert "tool messages are not supported by this template" in str(info.value)
    assert str(strict) in str(info.value)
    assert fake.seen == []  # nothing reached the stack
    [rec] = p.wait_records(1)
    assert rec["client_status"] == 400 and rec["error_kind"] == "condition_rejected"
    assert rec["condition_note"].startswith("rejected: chat template") and rec["status"] is None


@pytest.mark.parametrize(
    "args, message",
    [
        (("--chat-template", "{tmp}/missing.jinja"), "does not exist"),
        (("--chat-template", "{tmp}/bad.jinja"), "syntax error at line 1"),
        (("--chat-template", "{tmp}/bad.json"), "not valid JSON"),
        (("--parser", "nonsense"), "unknown; choose one of hermes"),
    ],
)
def test_serve_rejects_bad_template_options_at_start(tmp_path, args, message):
    (tmp_path / "bad.jinja").write_text("{% for %}")
    (tmp_path / "bad.json").write_text("{")
    args = tuple(a.format(tmp=tmp_path) for a in args)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--port",
            "0",
            "--data",
            str(tmp_path / "d"),
            "--condition",
            "template",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_template_without_a_template_file_is_skipped(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    fake.enqueue(text("native answer"))
    p = proxy(fake.url, "--condition", "template")
    r = client(p).chat.completions.create(model=fake.model, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "native answer"
    [rec] = p.wait_records(1)
    assert rec["condition_note"] == "skipped: no chat template: start toolproxy serve with --chat-template FILE"
