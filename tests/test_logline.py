"""serve's line per record: exchanges as before, failures and fingerprint probes in words."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import pytest

from toolproxy.proxy.logline import log_line
from toolproxy.record.model import Record

REFUSED = (
    "cannot connect to upstream http://127.0.0.1:9: nothing is listening at 127.0.0.1:9 (connection refused). "
    "Is the model server running, and are the host and port in the URL right?"
)


def _fp(**kw) -> Record:
    return Record(id="f", started_at=0.0, kind="fingerprint", upstream="http://127.0.0.1:8080", duration_ms=11.2, **kw)


CASES = [
    (
        "ok",
        Record(
            id="x",
            started_at=0.0,
            method="POST",
            path="/v1/chat/completions",
            run="r",
            episode="3",
            status=200,
            duration_ms=12.4,
        ),
        "200 POST /v1/chat/completions run=r ep=3 12ms",
    ),
    (
        "connect",
        Record(
            id="x",
            started_at=0.0,
            method="POST",
            path="/v1/chat/completions",
            client_status=502,
            duration_ms=3.0,
            error_kind="connect",
            error_message=REFUSED,
        ),
        "502 POST /v1/chat/completions 3ms !connect: " + REFUSED,
    ),
    (
        "long-message",
        Record(
            id="x",
            started_at=0.0,
            method="POST",
            path="/v1/responses",
            client_status=504,
            duration_ms=3.0,
            error_kind="timeout",
            error_message="stalled\n" + "x" * 300,
        ),
        "504 POST /v1/responses 3ms !timeout: stalled " + "x" * 189 + "...",
    ),
    (
        "kind-without-message",
        Record(id="x", started_at=0.0, method="GET", path="/", status=200, duration_ms=1.0, error_kind="client_closed"),
        "200 GET / 1ms !client_closed",
    ),
    (
        "fingerprint",
        _fp(extra={"stack": "llamacpp", "version": "b6500", "model": None}),
        "fingerprint of http://127.0.0.1:8080 llama.cpp (llama-server) b6500 (11ms)",
    ),
    (
        "fingerprint-model",
        _fp(extra={"stack": "ollama", "version": "0.12.6", "model": "qwen2.5:7b"}),
        "fingerprint of http://127.0.0.1:8080 model qwen2.5:7b: Ollama 0.12.6 (11ms)",
    ),
    (
        "fingerprint-unknown",
        _fp(extra={"stack": "unknown"}),
        "fingerprint of http://127.0.0.1:8080 an unidentified server (11ms)",
    ),
    (
        "fingerprint-unreachable",
        _fp(
            extra={"stack": "unreachable"},
            error_kind="connect",
            error_message="cannot connect to http://127.0.0.1:8080: nothing is listening",
        ),
        "fingerprint of http://127.0.0.1:8080 upstream unreachable: cannot connect to http://127.0.0.1:8080: nothing "
        "is "
        "listening (11ms)",
    ),
]


@pytest.mark.parametrize("rec, line", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_log_line(rec, line):
    assert log_line(rec) == line


def test_serve_prints_the_probe_and_the_failed_exchange_in_words(proxy):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = proxy(f"http://127.0.0.1:{port}")
    try:
        urllib.request.urlopen(
            urllib.request.Request(p.url + "/v1/chat/completions", data=b"{}", method="POST"), timeout=10
        )
    except urllib.error.HTTPError as exc:
        assert exc.code == 502
    deadline = time.monotonic() + 120  # a guard against a hang, not a speed claim: the loop ends when both are out
    while time.monotonic() < deadline and not ("!connect" in p.output() and "fingerprint of" in p.output()):
        time.sleep(0.05)
    out = p.output()
    assert (
        f"fingerprint of http://127.0.0.1:{port} upstream unreachable: cannot connect to http://127.0.0.1:{port}: "
        f"nothing is listening at 127.0.0.1:{port} (connection refused)." in out
    )
    assert "502 POST /v1/chat/completions" in out and "!connect: cannot connect to upstream" in out
    assert "---  " not in out and "Errno" not in out
