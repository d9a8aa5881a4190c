"""Spans into a real OTLP receiver from PyPI: Arize Phoenix, in its own cached virtualenv (built by
examples/recipes/harnesses.py's builder, like the harness recipes), started on 127.0.0.1, its
spans read back through its REST API.

Slow (the first run installs Phoenix, ~850 MB; it takes ~40 s to start), so deselected by
default: `pytest -m phoenix tests/test_otlp_phoenix.py`. With TOOLPROXY_OTLP_EVIDENCE=DIR the spans
Phoenix stored are also written there as JSON.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from otlpreceiver import send_chat
from proxyprocess import ProxyProcess

from toolproxy import emulators as fakes

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "recipes"))
from harnesses import Harness, build  # noqa: E402

pytestmark = [pytest.mark.phoenix, pytest.mark.timeout(1800)]

PHOENIX = Harness("arize-phoenix", "20.26.1", ("arize-phoenix==20.26.1",))
SECRET = "sk-live-phoenix-0123456789"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
SCRIPT = {
    "weather in Paris?": fakes.call("get_weather", {"city": "Paris"}),
    "weather in Oslo?": fakes.text_call("hermes", "get_weather", {"city": "Oslo"}),
    "hello": fakes.text("Hello! How can I help?"),
    "big question": fakes.error(500, "out of memory"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    root = build(PHOENIX)
    port = free_port()
    work = tmp_path_factory.mktemp("phoenix")
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }
    log = open(work / "phoenix.log", "w")
    proc = subprocess.Popen(
        [str(root / "bin" / "phoenix"), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"phoenix did not start:\n{(work / 'phoenix.log').read_text()[-3000:]}"
                    ) from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def spans_of(url: str, project: str, n: int, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            spans = get(f"{url}/v1/projects/{project}/spans?limit=100")["data"]
        except urllib.error.HTTPError:  # the project appears with its first span
            spans = []
        if len(spans) >= n or time.monotonic() > deadline:
            return sorted(spans, key=lambda s: s["start_time"])
        time.sleep(0.5)


def send(url: str, prompt: str, episode: str) -> int:
    return send_chat(
        url,
        prompt,
        run="phoenix-demo",
        episode=episode,
        model="qwen2.5-coder",
        tools=TOOLS,
        secret=SECRET,
        temperature=0,
    )


def save(name: str, spans: list[dict]) -> None:
    where = os.environ.get("TOOLPROXY_OTLP_EVIDENCE")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / name).write_text(json.dumps(spans, indent=2, sort_keys=True) + "\n")


def test_phoenix_stores_serve_and_export_spans(phoenix, tmp_path):
    data = tmp_path / "data"
    with ExitStack() as stack:
        fake = fakes.FakeStack("llamacpp", responder=lambda req: SCRIPT[req.messages[-1]["content"]])
        stack.enter_context(fake.in_thread())
        p = ProxyProcess(fake.url, data, ("--otlp-endpoint", phoenix, "--quiet"))
        stack.callback(p.stop)
        statuses = [send(p.url, prompt, str(i)) for i, prompt in enumerate(SCRIPT)]
        assert statuses == [200, 200, 200, 500]
        served = spans_of(phoenix, "default", len(SCRIPT))
    save("serve-spans.json", served)
    assert len(served) == len(SCRIPT)
    assert SECRET not in json.dumps(served) and "Paris" not in json.dumps(served)
    for span in served:
        a = span["attributes"]
        assert span["name"] == "chat qwen2.5-coder" and span["span_kind"] == "LLM"  # Phoenix recognised a GenAI span
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "qwen2.5-coder"
        assert (
            a["toolproxy.run"] == "phoenix-demo"
            and a["toolproxy.condition"] == "native"
            and a["toolproxy.stack"] == "llamacpp"
        )
    call, text_call, prose, failed = served
    assert call["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert [(e["name"], e["attributes"]["gen_ai.tool.name"]) for e in call["events"]] == [
        ("toolproxy.tool_call", "get_weather")
    ]
    assert text_call["events"] == [] and prose["events"] == []
    assert failed["status_code"] == "ERROR" and failed["attributes"]["error.type"] == "500"

    out = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "analyze", "--data", str(data), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "export",
            "--data",
            str(data),
            "--otlp",
            phoenix,
            "--otlp-content",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and f"otlp: {len(SCRIPT)} spans sent" in out.stdout, out.stdout + out.stderr
    # Phoenix files a span under its trace's project: the analysed spans join the live spans' traces
    everything = spans_of(phoenix, "default", 2 * len(SCRIPT))
    exported = [s for s in everything if "toolproxy.outcome" in s["attributes"]]
    save("export-spans.json", exported)
    assert len(everything) == 2 * len(SCRIPT) and len(exported) == len(SCRIPT)
    assert [s["context"]["trace_id"] for s in exported] == [s["context"]["trace_id"] for s in served]
    verdicts = [
        (
            s["attributes"]["toolproxy.outcome"],
            s["attributes"].get("toolproxy.surface"),
            s["attributes"].get("toolproxy.sub_kind"),
        )
        for s in exported
    ]
    assert verdicts == [
        ("valid_call", "native", None),
        ("valid_call", "text", None),
        ("prose", None, None),
        ("non_response", None, "http_5xx"),
    ]
    text_event = exported[1]["events"][0]["attributes"]
    assert text_event["gen_ai.tool.name"] == "get_weather" and text_event["toolproxy.call.surface"] == "text"
    assert text_event["toolproxy.call.valid"] is True and json.loads(text_event["gen_ai.tool.call.arguments"]) == {
        "city": "Oslo"
    }
    assert "weather in Paris?" in json.dumps(exported[0]["attributes"]["gen_ai.input.messages"])
    assert SECRET not in json.dumps(exported)
