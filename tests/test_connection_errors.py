"""Connection failures in words: the pure table, then doctor and the proxy's 502 against a closed port."""

from __future__ import annotations

import errno
import socket
import ssl
import subprocess
import sys

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from toolproxy.term.connection_errors import explain, with_detail


def _connector(os_error: OSError, cls=aiohttp.ClientConnectorError) -> aiohttp.ClientConnectorError:
    key = ConnectionKey("model.example", 8080, False, True, None, None, None, None)
    return cls(key, os_error)


CASES = [
    (
        "refused",
        _connector(ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 8080)")),
        "nothing is listening at model.example:8080 (connection refused)",
        "Is the model server running",
    ),
    (
        "dns",
        _connector(socket.gaierror(-2, "Name or service not known"), aiohttp.ClientConnectorDNSError),
        "the host name model.example could not be resolved",
        "Check the host name",
    ),
    (
        "no-route",
        _connector(OSError(errno.EHOSTUNREACH, "No route to host")),
        "there is no network route to model.example:8080",
        "reachable from this machine",
    ),
    (
        "timed-out",
        _connector(TimeoutError(errno.ETIMEDOUT, "Connect call failed")),
        "model.example:8080 did not answer in time",
        "firewall or VPN",
    ),
    (
        "tls",
        _connector(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")),
        "the TLS (https) handshake with model.example:8080 failed",
        "http:// versus https://",
    ),
    (
        "reset",
        aiohttp.ServerDisconnectedError(),
        "the server closed the connection without answering",
        "It may also have crashed",
    ),
    ("plain-timeout", TimeoutError(), "the server did not answer in time", "firewall or VPN"),
    (
        "other-oserror",
        OSError(errno.EACCES, "Permission denied"),
        "cannot connect to the server: permission denied",
        "is the URL right",
    ),
    (
        "unknown",
        aiohttp.ClientPayloadError("bad"),
        "the connection to the server failed (ClientPayloadError)",
        "is the URL right",
    ),
]


@pytest.mark.parametrize("exc, what, advice", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_explain_says_what_failed_and_what_to_check(exc, what, advice):
    problem = explain(exc)
    assert problem.what == what
    assert advice in problem.advice
    assert "Errno" not in problem.sentence() and "Connect call failed" not in problem.sentence()
    assert problem.detail  # the system's own words are kept, for a second line


def test_detail_is_the_systems_own_text_on_a_second_line():
    problem = explain(CASES[0][1])
    assert problem.detail == "[Errno 111] Connect call failed ('127.0.0.1', 8080)"
    assert with_detail("cannot diagnose: x", problem.detail).splitlines() == [
        "cannot diagnose: x",
        "  detail: [Errno 111] Connect call failed ('127.0.0.1', 8080)",
    ]
    assert with_detail("cannot diagnose: x", None) == "cannot diagnose: x"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_doctor_says_a_sentence_and_keeps_errno_text_to_the_detail_line(tmp_path):
    port = _closed_port()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "doctor",
            "--upstream",
            f"http://127.0.0.1:{port}",
            "--model",
            "m",
            "--data",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    problem, detail = [line for line in r.stdout.splitlines() if "cannot diagnose" in line or "detail:" in line]
    assert problem == (
        f"cannot diagnose: cannot connect to http://127.0.0.1:{port}: nothing is listening at "
        f"127.0.0.1:{port} (connection refused). Is the model server running, and are the host and "
        "port in the URL right?"
    )
    assert detail.startswith("  detail: [Errno 111]")


async def test_the_proxys_502_says_it_in_words(tmp_path):
    from toolproxy.checks.local import local_proxy

    port = _closed_port()
    async with local_proxy(f"http://127.0.0.1:{port}", tmp_path / "d", "r") as lp:
        probe = await lp.post("/v1/chat/completions", {"model": "m", "messages": []})
    assert probe.reply.status == 502 and probe.record.error_kind == "connect"
    assert probe.record.error_message == (
        f"cannot connect to upstream http://127.0.0.1:{port}: nothing is listening at "
        f"127.0.0.1:{port} (connection refused). Is the model server running, and "
        "are the host and port in the URL right?"
    )
