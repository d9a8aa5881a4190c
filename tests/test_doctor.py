"""doctor against the fake stacks: one verdict per layer, in the diagnosis order, the stack's own evidence,
the per-stack fix, the repeat and template checks, the records it leaves, and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
import pytest

from toolproxy.checks.doctor import diagnose, render
from toolproxy.emulators import ModelRequest, ScriptedReply, broken_call, call, text, text_call
from toolproxy.record.segments import read_records

PARIS = {"city": "Paris"}


READY = text("ready")


def model(on_tools: ScriptedReply, on_plain: ScriptedReply = READY):
    """A scripted model: answers the tool probe one way and the plain control request another."""

    def respond(req: ModelRequest) -> ScriptedReply:
        return on_tools if req.tools else on_plain

    return respond


async def run(fake, model_name, tmp_path, **kw):
    diag = await diagnose(fake.url, model_name, tmp_path / "data", **kw)
    return diag, render(diag)


@pytest.mark.parametrize(
    "kind, options, model_name, reply, at_fault, step, says, fix",
    [
        # 1. refused by the serving layer: the model never ran
        (
            "ollama",
            {},
            "gemma3",
            call("get_weather", PARIS),
            "serving_layer",
            1,
            [
                'Ollama 0.12.6 answered HTTP 400 "registry.ollama.ai/library/gemma3:latest does not support tools"',
                "the model never ran",
                "only tools are refused",
                "Its capabilities are [completion, vision]",
            ],
            ["`ollama show MODEL` must list 'tools'", "--condition text"],
        ),
        (
            "vllm",
            {},
            "Qwen/Qwen2.5-7B-Instruct",
            call("get_weather", PARIS),
            "serving_layer",
            1,
            [
                'vLLM 0.11.0 answered HTTP 400 "\\"auto\\" tool choice requires --enable-auto-tool-choice and '
                '--tool-call-parser to be set"'
            ],
            ["--enable-auto-tool-choice --tool-call-parser NAME", "hermes for Qwen2.5"],
        ),
        (
            "no_jinja",
            {},
            "qwen",
            call("get_weather", PARIS),
            "serving_layer",
            1,
            ['answered HTTP 500 "tools param requires --jinja flag"', "started with --no-jinja"],
            ["restart llama-server with `--jinja`"],
        ),
        (
            "llamacpp",
            {},
            "qwen",
            broken_call('<tool_call>{"name": "get_weather", "arguments": {"city": '),
            "serving_layer",
            1,
            ['HTTP 500 "Failed to parse input at pos 0', "did not match the tool-call format"],
            ["--chat-template-file"],
        ),
        (
            "ollama",
            {},
            "qwen2.5:7b",
            call("get_time", {}),
            "serving_layer",
            1,
            [
                "EMPTIED by the serving layer",
                "The model ran: nothing delivered although the stack reports",
                "drops a call to a tool name that was not offered",
            ],
            ["--condition text"],
        ),
        # 2. accepted, but the call came back as text
        (
            "sglang",
            {},
            "Qwen/Qwen2.5-7B-Instruct",
            call("get_weather", PARIS),
            "parser",
            2,
            [
                "the call came back as TEXT",
                "Hermes/Qwen `<tool_call>",
                'get_weather({"city": "Paris"}) and the call itself is valid',
            ],
            ["relaunch SGLang with `--tool-call-parser qwen25` (called `qwen` in newer SGLang releases)"],
        ),
        (
            "vllm",
            {"tool_parser": "hermes"},
            "Qwen/Qwen2.5-7B-Instruct",
            text_call("fenced", "get_weather", PARIS, before="Sure:\n"),
            "parser",
            2,
            ["a fenced ```json block"],
            ["no vLLM tool parser reads this format"],
        ),
        (
            "vllm",
            {"tool_parser": "hermes", "call_format": "llama3"},
            "Qwen/Qwen2.5-7B-Instruct",
            text_call("llama3", "get_weather", PARIS),
            "parser",
            2,
            ["Llama 3 JSON"],
            ["--tool-call-parser llama3_json"],
        ),
        (
            "lmstudio",
            {},
            "google/gemma-3-4b",
            call("get_weather", PARIS),
            "parser",
            2,
            ["LM Studio `[TOOL_REQUEST]`"],
            ["trained for tool use"],
        ),
        (
            "llamacpp",
            {},
            "qwen",
            text_call("fenced", "get_weather", PARIS),
            "parser",
            2,
            ["a fenced ```json block"],
            ["no llama-server parser reads plain JSON calls", "--condition text"],
        ),
        (
            "llamacpp",
            {"call_format": "llama3"},
            "qwen",
            text_call("llama3", "get_weather", PARIS),
            "parser",
            2,
            ["Llama 3 JSON"],
            ["picks its parser from the chat template", "--chat-template-file"],
        ),
        # llama-cpp-python drops tools under tool_choice auto: the call the model writes anyway stays in content
        (
            "llama-cpp-python",
            {},
            "qwen",
            call("get_weather", PARIS),
            "parser",
            2,
            ["the call came back as TEXT", "a bare JSON object"],
            ["--chat_format chatml-function-calling"],
        ),
        # 3. the model made no call, or an invalid one
        (
            "ollama",
            {},
            "qwen2.5:7b",
            text("I cannot check live weather, sorry."),
            "model",
            3,
            ['NO CALL: the model answered in prose: "I cannot check live weather, sorry."'],
            ["--condition hint"],
        ),
        (
            "openai",
            {},
            "gpt-4o-mini",
            call("get_weather", {"town": "Paris"}),
            "model",
            3,
            ["INVALID CALL", "'city' is a required property"],
            ["--condition constrained"],
        ),
        # the model emitted its end token first (Qwen2.5-Coder-0.5B on llama.cpp does): nothing was lost in serving
        (
            "llamacpp",
            {},
            "qwen",
            text(""),
            "model",
            3,
            [
                "NO OUTPUT: the model ended its turn at once: 1 completion token, its end token, and no text",
                "the model's doing, not the server's",
            ],
            ["--condition hint"],
        ),
    ],
    ids=[
        "ollama-refuses",
        "vllm-refuses",
        "llamacpp-no-jinja",
        "llamacpp-parse-500",
        "ollama-drops-unknown-tool",
        "sglang-no-parser",
        "vllm-fenced-json",
        "vllm-wrong-parser",
        "lmstudio-text",
        "llamacpp-text",
        "llamacpp-other-format",
        "llama-cpp-python-drops-tools",
        "model-prose",
        "model-invalid",
        "model-stopped-at-once",
    ],
)
async def test_verdict_per_stack(fake_stack, tmp_path, kind, options, model_name, reply, at_fault, step, says, fix):
    fake = fake_stack(kind, responder=model(reply), **options)
    diag, out = await run(fake, model_name, tmp_path, repeat=0)
    v = diag.verdict
    assert (v.native_ok, v.at_fault, v.exit_code) == (False, at_fault, 1), out
    failed = [s for s in v.steps if s.status == "fail"]
    assert [s.number for s in failed] == [step], out
    assert all(s.status == "pass" for s in v.steps if s.number < step)
    assert all(s.status == "skipped" for s in v.steps if s.number > step)
    for phrase in says:
        assert phrase in failed[0].summary, out
    for phrase in fix:
        assert phrase in failed[0].fix, out
    if at_fault != "model":  # the fix names the layer the verdict names
        assert not failed[0].fix.lower().startswith(("the model", "use a model")), failed[0].fix
    assert "tools do NOT work natively" in out


@pytest.mark.parametrize(
    "kind, model_name, options",
    [
        ("llamacpp", "qwen", {}),
        ("ollama", "qwen2.5:7b", {}),
        ("vllm", "Qwen/Qwen2.5-7B-Instruct", {"tool_parser": "hermes"}),
        ("sglang", "Qwen/Qwen2.5-7B-Instruct", {"tool_parser": "qwen25"}),
        ("lmstudio", "qwen2.5-7b-instruct", {}),
    ],
)
async def test_native_tools_work(fake_stack, tmp_path, kind, model_name, options):
    fake = fake_stack(kind, responder=model(call("get_weather", PARIS)), **options)
    diag, out = await run(fake, model_name, tmp_path, repeat=2)
    assert diag.verdict.exit_code == 0 and diag.verdict.native_ok, out
    assert [s.status for s in diag.verdict.steps] == ["pass", "pass", "pass"]
    assert 'valid call: get_weather({"city":"Paris"})' in out.replace('{"city": "Paris"}', '{"city":"Paris"}')
    assert "Verdict: tools work natively." in out


async def test_repeat_reports_differing_greedy_outputs_and_cache(fake_stack, tmp_path):
    replies = iter([call("get_weather", PARIS), call("get_weather", PARIS), call("get_weather", {"city": "paris"})])
    fake = fake_stack("llamacpp", responder=lambda req: next(replies) if req.tools else text("ready"), cached_tokens=12)
    diag, out = await run(fake, "qwen", tmp_path, repeat=3)
    assert diag.repeat["distinct_outputs"] == 2 and diag.repeat["differ"] is True
    assert diag.repeat["cached_tokens"] == [12, 12, 12]
    assert "3 identical greedy requests gave 2 different outputs" in out
    assert "cached prompt tokens: 12, 12, 12" in out


async def test_repeat_falls_back_to_the_plain_request_when_tools_are_refused(fake_stack, tmp_path):
    fake = fake_stack("vllm", responder=model(call("get_weather", PARIS)))
    diag, out = await run(fake, "Qwen/Qwen2.5-7B-Instruct", tmp_path, repeat=3)
    assert diag.repeat["request"] == "the request without tools, since tools are refused"
    assert diag.repeat["answered"] == 3 and diag.repeat["distinct_outputs"] == 1
    assert "vLLM reports it with --enable-prompt-tokens-details" in out


@pytest.mark.parametrize(
    "version, ok, phrase",
    [
        ("0.14.1", False, "renders the tool as Go struct syntax, not JSON (ollama/ollama#14601)"),
        ("0.12.6", True, "Go struct syntax from 0.14.0 on"),
    ],
)
async def test_ollama_template_go_struct_pattern(fake_stack, tmp_path, version, ok, phrase):
    fake = fake_stack("ollama", responder=model(call("get_weather", PARIS)))
    fake.stack.version = version
    diag, out = await run(fake, "qwen2.5:7b", tmp_path, repeat=0)
    assert diag.template["ok"] is ok and phrase in diag.template["summary"], out
    assert diag.template["evidence"] == "{{ .Function }}"
    assert diag.verdict.exit_code == 0, "a template warning does not change whether tools work"


@pytest.mark.parametrize(
    "kind, ok, phrase",
    [
        ("llamacpp", True, "rendered into the prompt as JSON"),
        (
            "no_jinja",
            False,
            'could not render the tools with its template: HTTP 500 "tools param requires --jinja flag"',
        ),
    ],
)
async def test_llamacpp_rendered_prompt_check(fake_stack, tmp_path, kind, ok, phrase):
    fake = fake_stack(kind, responder=model(call("get_weather", PARIS)))
    diag, out = await run(fake, "qwen", tmp_path, repeat=0)
    assert diag.template["ok"] is ok and phrase in diag.template["summary"], out
    assert diag.template["source"] == "llama.cpp GET /props chat_template" if kind == "llamacpp" else True


async def test_every_probe_is_recorded_under_run_doctor(fake_stack, tmp_path):
    fake = fake_stack("sglang", responder=model(call("get_weather", PARIS)))
    await diagnose(fake.url, "Qwen/Qwen2.5-7B-Instruct", tmp_path / "data", repeat=2)
    recs = read_records(tmp_path / "data", "exchange")
    items = [r["item"] for r in recs if r["run"] == "doctor"]
    assert items == ["control", "tools", "repeat", "responses", "messages"], items
    tools = next(r for r in recs if r["item"] == "tools")
    assert tools["status"] == 200 and "<tool_call>" in tools["response_body"]
    fps = [r for r in read_records(tmp_path / "data") if r.get("kind") == "fingerprint"]
    assert {r["extra"]["model"] for r in fps} == {None, "Qwen/Qwen2.5-7B-Instruct"}
    assert all(r["run"] == "doctor" for r in fps)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from toolproxy.cli import main; main()", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_exit_codes_and_json(fake_stack, tmp_path):
    good = fake_stack("llamacpp", responder=model(call("get_weather", PARIS)))
    r = cli("--upstream", good.url, "--model", "qwen", "--data", str(tmp_path / "a"), "--json", "--repeat", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    out = orjson.loads(r.stdout)
    assert out["exit_code"] == 0 and out["verdict"]["native_ok"] is True
    assert out["fingerprint"]["stack"] == "llamacpp" and "chat_template" not in out["fingerprint"]

    refused = fake_stack("vllm")
    r = cli("--upstream", refused.url, "--model", "Qwen/Qwen2.5-7B-Instruct", "--data", str(tmp_path / "b"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1. Serving layer: [FAIL] REFUSED" in r.stdout and "at fault: the serving layer" in r.stdout

    r = cli("--upstream", "http://127.0.0.1:9", "--model", "m", "--data", str(tmp_path / "c"))
    assert r.returncode == 2
    assert "cannot connect to http://127.0.0.1:9" in r.stdout and "Is the model server running" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr

    ollama = fake_stack("ollama")
    r = cli("--upstream", ollama.url, "--model", "nosuchmodel", "--data", str(tmp_path / "d"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        'Ollama 0.12.6 does not know model \'nosuchmodel\': HTTP 404 "model \\"nosuchmodel\\" not found, '
        'try pulling it first" (it lists: qwen2.5:7b, gemma3:latest)'
    ) in r.stdout, r.stdout
    assert "warning: model 'nosuchmodel' is not in the server's model list" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("--upstream", "ftp://x", "--model", "m"), "--upstream must be an http(s) URL"),
        (
            ("--upstream", "http://127.0.0.1:9", "--model", "m", "--api-key-env", "TOOLPROXY_TEST_UNSET_VAR"),
            "TOOLPROXY_TEST_UNSET_VAR: that environment variable is empty or unset",
        ),
    ],
)
def test_cli_usage_errors(tmp_path, args, message):
    r = cli(*args, "--data", str(tmp_path / "d"))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_cli_output_is_inert_whatever_the_server_says(fake_stack, tmp_path):
    hostile = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202eevil"
    fake = fake_stack("sglang", responder=model(text_call("fenced", "get_" + hostile, PARIS, before=hostile)))
    r = cli("--upstream", fake.url, "--model", "m" + hostile, "--data", str(tmp_path / "a"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "\\x1b]0;owned\\x07\\u009b31m\\u202eevil" in r.stdout, r.stdout
    assert not any(c in r.stdout for c in "\x1b\x07\x9b\u202e"), r.stdout
    r = cli("--upstream", fake.url, "--model", "m" + hostile, "--data", str(tmp_path / "b"), "--json")
    assert not any(c in r.stdout for c in "\x1b\x07\x9b\u202e") and orjson.loads(r.stdout)["model"] == "m" + hostile


@pytest.mark.parametrize(
    "kind, model_name, options, responses, messages",
    [
        (
            "llamacpp",
            "qwen",
            {},
            "served; its stream events carry no output_index, so the openai SDK's responses.stream() "
            "helper fails on them",
            "served",
        ),
        (
            "ollama",
            "qwen2.5:7b",
            {},
            "not served (HTTP 404); openai-agents, pydantic-ai's openai: models need "
            "`toolproxy serve --bridge responses`",
            "not served (HTTP 404); the anthropic SDK, Claude-Code-style clients need "
            "`toolproxy serve --bridge messages`",
        ),
        ("vllm", "Qwen/Qwen2.5-7B-Instruct", {"tool_parser": "hermes"}, "not served (HTTP 404)", "served"),
    ],
)
async def test_agent_protocols_are_probed(fake_stack, tmp_path, kind, model_name, options, responses, messages):
    fake = fake_stack(kind, responder=model(call("get_weather", PARIS)), **options)
    diag, out = await run(fake, model_name, tmp_path, repeat=0)
    assert diag.protocols["Responses"]["summary"].startswith(responses), out
    assert diag.protocols["Messages"]["summary"].startswith(messages), out
    assert f"Agent protocol Responses (/v1/responses): {responses}" in out


def test_the_header_and_each_check_show_at_once_on_a_terminal(fake_stack, tmp_path):
    """A CPU model takes a minute over doctor's probes: the header comes at once, each check as it
    completes, and a line says what is being waited for, so the command never looks hung."""
    import threading

    from ptyrun import REDRAW, Terminal

    release = threading.Event()

    def held(req: ModelRequest) -> ScriptedReply:
        if req.tools:
            release.wait(60)  # the fake serves one request at a time: doctor waits on this one
            return call("get_weather", PARIS)
        return text("ready")

    fake = fake_stack("llamacpp", responder=held)
    term = Terminal(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "doctor",
            "--upstream",
            fake.url,
            "--model",
            "qwen",
            "--data",
            str(tmp_path / "d"),
            "--repeat",
            "0",
        ]
    )
    try:
        assert term.wait_for(b"stack: ", 30), bytes(term.seen)  # header and stack, before any reply
        assert term.wait_for(b"doctor: waiting for the request without tools, then the one with tools (", 10), bytes(
            term.seen
        )
        assert b"toolproxy doctor: " + fake.url.encode() + b", model qwen" in term.seen
        assert b"1. Serving layer" not in term.seen
    finally:
        release.set()
    assert term.finish() == 0, bytes(term.seen)
    shown = bytes(term.seen)
    assert (
        shown.index(b"1. Serving layer: [ok]")
        < shown.index(b"Agent protocol Responses")
        < shown.index(b"Verdict: tools work natively.")
    )
    assert shown.rstrip().endswith(b"Verdict: tools work natively."), (
        shown
    )  # the waiting line is erased, not left behind
    assert REDRAW in shown


def test_piped_output_is_the_diagnosis_alone(fake_stack, tmp_path):
    fake = fake_stack("llamacpp", responder=model(call("get_weather", PARIS)))
    r = cli("--upstream", fake.url, "--model", "qwen", "--data", str(tmp_path / "d"), "--repeat", "0")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "waiting for" not in r.stdout and "\r" not in r.stdout
    assert r.stdout.startswith(f"toolproxy doctor: {fake.url}, model qwen\nstack: ")
    assert r.stdout.endswith("\nVerdict: tools work natively.\n")


def test_a_launch_that_refuses_tools_is_not_said_to_have_them(fake_stack, tmp_path):
    """llama-server --no-jinja still advertises its chat template's tools; the capabilities line
    and the refusal say which one holds."""
    fake = fake_stack("no_jinja", responder=model(call("get_weather", PARIS)))
    r = cli("--upstream", fake.url, "--model", "qwen", "--data", str(tmp_path / "d"), "--repeat", "0")
    assert r.returncode == 1, r.stdout + r.stderr
    (caps,) = [line for line in r.stdout.splitlines() if line.startswith("model capabilities:")]
    assert caps.startswith("model capabilities: completion, tools (advertised, but refused by this launch: see 1.)"), (
        caps
    )
    assert "the launch refuses tools, not the model" in r.stdout
    assert r.stdout.index("model capabilities:") < r.stdout.index("1. Serving layer: [FAIL]")


def test_without_model_it_asks_the_server_which_it_serves(fake_stack, tmp_path):
    """llama-server answers whatever model name it is sent: requiring --model made the user guess."""
    one = fake_stack("llamacpp", responder=model(call("get_weather", PARIS)))
    r = cli("--upstream", one.url, "--data", str(tmp_path / "a"), "--repeat", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"toolproxy doctor: {one.url}"
    assert f"model: {one.model}, the one the server serves (--model to ask for another)" in lines
    assert [
        json.loads(rec["request_body"])["model"]
        for rec in read_records(tmp_path / "a", "exchange")
        if rec["item"] == "tools"
    ] == [one.model]

    several = fake_stack("ollama")
    r = cli("--upstream", several.url, "--data", str(tmp_path / "b"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        "cannot diagnose: Ollama 0.12.6 serves 2 models: pass --model, one of: qwen2.5:7b, gemma3:latest" in r.stdout
    ), r.stdout
    assert "Traceback" not in r.stdout + r.stderr and "model capabilities" not in r.stdout


def test_the_probes_stay_out_of_the_users_data_by_default(fake_stack, tmp_path):
    fake = fake_stack("llamacpp", responder=model(call("get_weather", PARIS)))
    r = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "doctor", "--upstream", fake.url, "--repeat", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "toolproxy-data" / "segments").exists()  # serve's default data: untouched
    assert {rec["run"] for rec in read_records(tmp_path / "toolproxy-data" / "doctor", "exchange")} == {"doctor"}
