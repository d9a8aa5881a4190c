"""`toolproxy run -- CMD`: a real harness process (the openai SDK) behind an in-process proxy."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from toolproxy.record.segments import read_records

HARNESS = textwrap.dedent("""
    import os, sys
    from openai import OpenAI
    client = OpenAI()  # no base_url: it must come from the environment toolproxy run sets
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model=os.environ.get("MODEL", "m"), messages=messages, tools=tools)
    msg = r.choices[0].message
    print("calls:", len(msg.tool_calls or []), "key:", os.environ["OPENAI_API_KEY"])
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
""")


def _toolproxy(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", *args], text=True, capture_output=True, timeout=120, **kw
    )


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    path = tmp_path_factory.mktemp("harness") / "agent.py"
    path.write_text(HARNESS)
    return path


def _env_without_keys() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE")}


def test_run_records_the_harness_and_exits_with_its_code(fake_stack, harness, tmp_path):
    fake = fake_stack("vllm", tool_parser="hermes")
    data = tmp_path / "data"
    done = _toolproxy(
        "run",
        "--upstream",
        fake.url,
        "--data",
        str(data),
        "--run",
        "r1",
        "--no-fingerprint",
        "--",
        sys.executable,
        str(harness),
        "3",
        env={**_env_without_keys(), "MODEL": fake.model},
    )
    assert done.returncode == 3, done.stderr
    assert "key: toolproxy-no-key" in done.stdout  # the SDK got a placeholder key, not a crash
    records = [r for r in read_records(data) if r.get("kind", "exchange") == "exchange"]
    assert len(records) == 1
    assert records[0]["run"] == "r1" and records[0]["path"] == "/v1/chat/completions"
    assert records[0]["status"] == 200
    assert "run r1: 1 episode, 1 turn " in done.stderr
    origin = re.search(
        r"^- r1: served (.+?) \(the reply's model field\); stack vLLM; tool parser .*analyzer v\d+\.$\n"
        r"^  Why this number: (.+)$",
        done.stderr,
        re.M,
    )
    assert origin, done.stderr  # the number comes with what produced it
    assert origin.group(1) == fake.model and origin.group(2) == "no turn was due a call."
    assert "toolproxy run: the harness exited with code 3 (toolproxy run exits with it too)" in done.stderr
    assert (data / "reports" / "r1.html").is_file()


def test_print_env_points_every_client_at_the_tagged_proxy(tmp_path):
    done = _toolproxy(
        "run",
        "--upstream",
        "http://127.0.0.1:9",
        "--run",
        "qwen native",
        "--data",
        str(tmp_path / "d"),
        "--tag",
        "category=simple",
        "--print-env",
        env=_env_without_keys(),
    )
    assert done.returncode == 0, done.stderr
    env = dict(line.split("=", 1) for line in done.stdout.splitlines())
    prefix = "/t/run=qwen%20native/category=simple"
    assert env["OPENAI_BASE_URL"].endswith(prefix + "/v1")
    assert env["ANTHROPIC_BASE_URL"].endswith(prefix)
    assert env["OLLAMA_HOST"].endswith(prefix)
    assert env["OLLAMA_BASE_URL"].endswith(prefix + "/v1")  # pydantic-ai's ollama: provider wants the /v1 root
    assert env["TOOLPROXY_BASE_URL"].endswith(prefix)  # a script appends /episode=N/.../v1 to it
    assert env["OPENAI_API_KEY"] == "toolproxy-no-key"
    # inspect-ai's openai-api/llm/MODEL exits 1 without a word unless both of its variables are set
    assert env["LLM_API_KEY"] == "toolproxy-no-key" and env["LLM_BASE_URL"].endswith(prefix + "/v1")
    assert (
        env["MSWEA_CONFIGURED"] == "true" and env["MSWEA_COST_TRACKING"] == "ignore_errors"
    )  # mini-swe-agent runs unattended
    assert not (tmp_path / "d").exists()  # printing the environment creates nothing


def test_an_existing_api_key_is_left_alone(tmp_path):
    done = _toolproxy(
        "run",
        "--upstream",
        "http://127.0.0.1:9",
        "--print-env",
        env={**_env_without_keys(), "OPENAI_API_KEY": "sk-mine"},
    )
    assert "OPENAI_API_KEY=" not in done.stdout


def test_sigterm_reaches_the_harness_and_records_are_kept(fake_stack, tmp_path):
    fake = fake_stack("vllm", tool_parser="hermes")
    script = tmp_path / "slow.py"
    script.write_text(
        textwrap.dedent("""
        import os, signal, sys, time, urllib.request, json
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))
        body = json.dumps({"model": os.environ["MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req).read()
        print("asked", flush=True)
        time.sleep(60)
    """)
    )
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "run",
            "--upstream",
            fake.url,
            "--data",
            str(data),
            "--run",
            "slow",
            "--no-fingerprint",
            "--no-analyze",
            "--",
            sys.executable,
            str(script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MODEL": fake.model},
    )
    assert proc.stdout.readline().strip() == "asked"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 42, err
    assert "interrupted" in err
    assert [r["run"] for r in read_records(data) if r.get("kind", "exchange") == "exchange"] == ["slow"]


def test_a_missing_command_is_a_clear_error(fake_stack, tmp_path):
    done = _toolproxy(
        "run", "--upstream", fake_stack("vllm").url, "--data", str(tmp_path / "d"), "--", "no-such-harness-xyz"
    )
    assert done.returncode != 0
    assert "no-such-harness-xyz: command not found" in done.stderr
    assert "Traceback" not in done.stderr


WAITER = textwrap.dedent("""
    import os, sys, time
    print(os.environ["OPENAI_BASE_URL"], flush=True)
    deadline = time.monotonic() + 30  # a proxy that says nothing fails the test instead of hanging it
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
""")


def test_the_proxy_address_and_live_page_are_printed_before_the_harness_runs(fake_stack, tmp_path):
    """The port is a free one picked at start: the first line says it, while the harness still runs."""
    import re
    import urllib.request

    upstream = fake_stack("vllm").url
    script, go = tmp_path / "wait.py", tmp_path / "go"
    script.write_text(WAITER)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "run",
            "--upstream",
            upstream,
            "--data",
            str(tmp_path / "d"),
            "--run",
            "r",
            "--no-fingerprint",
            "--no-analyze",
            "--",
            sys.executable,
            str(script),
            str(go),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env_without_keys(),
    )
    try:
        line = proc.stderr.readline()
        found = re.fullmatch(
            rf"toolproxy run: proxy on (http://127\.0\.0\.1:\d+) -> upstream {re.escape(upstream)}; "
            r"live page (\S+)\n",
            line,
        )
        assert found, line
        url, live = found.groups()
        assert live == url + "/_toolproxy/"
        assert proc.stdout.readline().strip() == url + "/t/run=r/v1"  # the harness was pointed at that proxy
        asked = urllib.request.Request(live, headers={"Accept": "text/html"})  # as a browser asks
        with urllib.request.urlopen(asked, timeout=10) as page:  # ... which serves its live page meanwhile
            assert page.status == 200 and page.headers.get_content_type() == "text/html"
    finally:
        go.touch()
        proc.communicate(timeout=60)
    assert proc.returncode == 0
