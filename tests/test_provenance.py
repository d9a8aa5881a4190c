"""Provenance in `report --study`: read from each emulated stack's probes and the recorded exchanges.

One study over every emulated stack (each serving the same model name), one task each; the
harness sends its sampling parameters and names a model of its own, which the study replaces."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from contextlib import ExitStack

import pytest

from toolproxy import emulators as fakes
from toolproxy.stacks import catalog

MODEL = "qwen2.5-7b"
HARNESS = textwrap.dedent("""
    from openai import OpenAI
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    try:
        msg = OpenAI(max_retries=0).chat.completions.create(model="harness-model", messages=messages, tools=tools,
                                                            temperature=0, seed=7, max_tokens=64).choices[0].message
        print(bool(msg.tool_calls))
    except Exception as exc:
        print("error answer:", exc)
""")
LAUNCHES = {  # upstream name -> (stack, emulator options)
    "ollama": ("ollama", {}),
    "jinja": ("llamacpp", {"cached_tokens": 12}),
    "nojinja": ("no_jinja", {}),
    "vllm": ("vllm", {"tool_parser": "hermes"}),
    "sglang": ("sglang", {}),
    "lmstudio": ("lmstudio", {}),
    "llcpp": ("llama-cpp-python", {}),
    "openai": ("openai", {}),
}


@pytest.fixture(scope="module")
def origins(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("provenance")
    (tmp / "agent.py").write_text(HARNESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    stacks = {
        name: fakes.FakeStack(
            kind,
            models={MODEL: ("completion", "tools")},
            responder=lambda req: fakes.call("get_weather", {"city": "Paris"}),
            **options,
        )
        for name, (kind, options) in LAUNCHES.items()
    }
    argv = [
        sys.executable,
        "-m",
        "toolproxy.cli",
        "study",
        "--model",
        MODEL,
        "--conditions",
        "native",
        "--data",
        str(tmp / "data"),
        "--name",
        "p",
    ]
    with ExitStack() as running:
        for name, fake in stacks.items():
            running.enter_context(fake.in_thread())
            argv += ["--upstream", f"{name}={fake.url}"]
        done = subprocess.run(
            [*argv, "--", sys.executable, str(tmp / "agent.py")], env=env, text=True, capture_output=True, timeout=300
        )
    assert "Traceback" not in done.stderr, done.stderr
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "report",
            "--data",
            str(tmp / "data"),
            "--study",
            "p",
            "--format",
            "json",
        ],
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    return {p["run"].split("-")[1]: p for p in json.loads(report.stdout)["provenance"]}, done.stdout


def test_every_run_names_its_stack_version_and_what_was_sent(origins):
    by_name, _ = origins
    assert sorted(by_name) == sorted(LAUNCHES)
    for name, p in by_name.items():
        kind = LAUNCHES[name][0] if name != "nojinja" else "llamacpp"
        entry = catalog.BY_NAME[kind]
        assert p["stack"] == kind
        if kind == "llamacpp":  # the whole build, its commit included (a source build is numbered b1)
            assert p["stack_version"] == entry.version
        elif entry.version is not None and kind != "openai":
            assert p["stack_version"] == entry.version.split("-")[0]
        assert p["requested_model"] == MODEL and p["harness_model"] == "harness-model"
        assert p["sampling"] == {"temperature": 0, "seed": 7, "max_tokens": 64}
        assert p["attempts"] == 1 and p["analyzer_version"] is not None
        assert p["served_model"] is not None and not p["served_differs"], p


def test_the_parser_and_the_template_as_each_stack_exposes_them(origins):
    by_name, _ = origins
    assert by_name["jinja"]["tool_parser"] == "active (calls arrived as tool_calls)"
    assert by_name["jinja"]["served_from"] == "the stack's model_path"
    assert by_name["jinja"]["template_hash"] == hashlib.sha256(catalog.HERMES_JINJA.encode()).hexdigest()[:12]
    assert by_name["jinja"]["renders_tools"] is True and by_name["jinja"]["cache_hits"] == 1
    assert by_name["ollama"]["template_hash"] == hashlib.sha256(catalog.OLLAMA_TEMPLATE.encode()).hexdigest()[:12]
    assert (
        by_name["ollama"]["template_source"] == "Ollama POST /api/show template" and by_name["ollama"]["renders_tools"]
    )
    assert by_name["vllm"]["tool_parser"].startswith("active") and by_name["vllm"]["template_hash"] is None
    assert by_name["sglang"]["tool_parser"] == "none seen (calls arrived only as text)"
    assert "calls left in text: no tool parser extracted them" in by_name["sglang"]["why"]
    assert "drops tools unless tool_choice names one" in by_name["llcpp"]["why"]
    assert by_name["llcpp"]["served_from"] == "the stack's model_path"  # its /v1/models lists the file
    assert by_name["vllm"]["served_from"] == "the reply's model field"
    assert by_name["nojinja"]["why"].startswith("every turn refused or failed by the serving layer")
    # its /props reports the template as --jinja does (tests/data/llamacpp), which it never used
    assert by_name["nojinja"]["template_hash"] == by_name["jinja"]["template_hash"]
    assert (
        by_name["nojinja"]["template_note"] == "the stack reports it, but refused every turn: it rendered none of them"
    )
    assert by_name["jinja"]["template_note"] is None
    assert "tools param requires --jinja flag" in by_name["nojinja"]["why"]
    assert by_name["openai"]["why"] == "the stack delivered the model's calls as tool_calls: the number is the model's"


def test_the_study_prints_a_why_line_per_run(origins):
    _, stdout = origins
    assert stdout.count("  Why this number: ") == len(LAUNCHES)
    assert "served qwen2.5-7b" in stdout
