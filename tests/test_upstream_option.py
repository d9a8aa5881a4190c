"""What `--upstream` accepts: a server root, or a hosted API's path prefix, never a base URL ending in /v1.

Every command that starts a proxy refuses `/v1` at start with the URL to give instead, and a
prefix that is not a version is forwarded with the request's path appended as the harness sent it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import openai
import pytest
from proxyprocess import together

from toolproxy.proxy.config import version_suffix_problem

COMMANDS = {
    "serve": ("serve", "--port", "0"),
    "run": ("run", "--", sys.executable, "-c", "pass"),
    "study": ("study", "--name", "s", "--", sys.executable, "-c", "pass"),
    "replay": ("replay", "--from", "nothing"),
    "doctor": ("doctor", "--model", "m"),
    "conformance": ("conformance", "--model", "m", "--runs", "1"),
}


def _toolproxy(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", *args],
        text=True,
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "upstream, problem",
    [
        ("http://127.0.0.1:8080", None),
        ("https://api.groq.com/openai", None),
        ("https://generativelanguage.googleapis.com/v1beta/openai", None),
        ("http://127.0.0.1:8080/v1", "--upstream http://127.0.0.1:8080"),
        ("https://openrouter.ai/api/v1", "--upstream https://openrouter.ai/api"),
        ("http://127.0.0.1:8080/v2", None),
        ("http://127.0.0.1:8080/openai/v1", "--upstream http://127.0.0.1:8080/openai"),
        ("http://127.0.0.1:8080/v1x", None),
    ],
)
def test_version_suffix_problem_names_the_url_to_give(upstream, problem):
    found = version_suffix_problem(upstream)
    if problem is None:
        assert found is None
    else:
        assert found is not None and f"give it without that: {problem}." in found and "/v1/chat/completions" in found


V1_UPSTREAMS = ["http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1/"]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """Every command with each /v1 upstream, run once per module and side by side (each in a
    directory of its own): {(command, upstream): (the finished run, its directory)}."""
    cases = [(command, upstream) for upstream in V1_UPSTREAMS for command in COMMANDS]
    dirs = [tmp_path_factory.mktemp(command) for command, _ in cases]

    def run(case, cwd):
        name, *rest = COMMANDS[case[0]]
        return _toolproxy(name, "--upstream", case[1], "--data", str(cwd / "d"), *rest, cwd=cwd)

    done = together(*[lambda case=case, cwd=cwd: run(case, cwd) for case, cwd in zip(cases, dirs)])
    return {case: (result, cwd) for case, result, cwd in zip(cases, done, dirs)}


@pytest.mark.parametrize("command", COMMANDS, ids=list(COMMANDS))
@pytest.mark.parametrize("upstream", V1_UPSTREAMS)
def test_every_command_refuses_an_upstream_ending_in_v1_at_start(command, upstream, refusals):
    done, cwd = refusals[command, upstream]
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "--upstream http://127.0.0.1:9/v1 ends in /v1; give it without that: --upstream http://127.0.0.1:9."
        in done.stderr
    )
    assert "/v1/v1/" in done.stderr and "Traceback" not in done.stderr
    assert not (cwd / "d").exists()  # refused before anything was created


def test_a_hosted_api_path_prefix_is_kept_and_the_request_path_appended(fake_stack, proxy):
    fake = fake_stack("openai", prefix="/api")
    p = proxy(fake.url + "/api", "--quiet", "--no-fingerprint")
    client = openai.OpenAI(base_url=p.url + "/v1", api_key="sk-x", max_retries=0)
    reply = client.chat.completions.create(model=fake.model, messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    assert [s.path for s in fake.seen] == ["/api/v1/chat/completions"]
    (rec,) = p.wait_records(1)
    assert rec["status"] == 200 and rec["path"] == "/v1/chat/completions" and rec["upstream"] == fake.url + "/api"


@pytest.mark.parametrize("command", ["doctor", "conformance"])
@pytest.mark.parametrize("flag", ["--upstream-key-env", "--api-key-env"])
def test_the_upstream_key_option_has_one_name_and_the_old_one_still_works(fake_stack, tmp_path, command, flag):
    fake = fake_stack("openai")
    extra = ("--runs", "1", "-o", str(tmp_path / "c.md")) if command == "conformance" else ("--repeat", "0")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            command,
            "--upstream",
            fake.url,
            "--model",
            fake.model,
            "--data",
            str(tmp_path / "d"),
            flag,
            "TP_TEST_UPSTREAM_KEY",
            *extra,
        ],
        text=True,
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TP_TEST_UPSTREAM_KEY": "sk-upstream-secret"},
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert fake.seen and all(s.headers.get("Authorization") == "Bearer sk-upstream-secret" for s in fake.seen)
    deprecated = "--api-key-env is deprecated; use --upstream-key-env" in done.stderr
    assert deprecated == (flag == "--api-key-env")
    help_text = _toolproxy(command, "--help").stdout
    assert "--upstream-key-env" in help_text and "--api-key-env" not in help_text


def test_both_spellings_at_once_is_a_usage_error(tmp_path):
    done = _toolproxy(
        "doctor",
        "--upstream",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--upstream-key-env",
        "A",
        "--api-key-env",
        "B",
        "--data",
        str(tmp_path / "d"),
    )
    assert done.returncode == 2 and "give --upstream-key-env only" in done.stderr and "Traceback" not in done.stderr
