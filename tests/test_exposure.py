"""Who can reach a proxy on 127.0.0.1: the Host check against DNS rebinding, the Origin check
against cross-site pages, the login form under a slow client, and what aiohttp's parser errors
may print. Real proxies as subprocesses, real sockets."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request
from urllib.parse import urlsplit

import pytest

from toolproxy.emulators import text
from toolproxy.proxy.exposure import Exposure, host_name

MSGS = [{"role": "user", "content": "the prompt that a web page must not read"}]


def call(url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, bytes]:
    """One request with exactly these headers (Host among them: no client default)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=15)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    "value, name",
    [
        ("localhost:8787", "localhost"),
        ("LOCALHOST", "localhost"),
        ("127.0.0.1:8787", "127.0.0.1"),
        ("[::1]:8787", "::1"),
        ("[::1]", "::1"),
        ("evil.example.:80", "evil.example"),
        ("a:b", None),
        ("[::1]x", None),
        ("", None),
        (":8787", None),
    ],
)
def test_host_names(value, name):
    assert host_name(value) == name


@pytest.mark.parametrize(
    "bind, allowed, host, ok",
    [
        ("127.0.0.1", (), "localhost:1", True),
        ("127.0.0.1", (), "app.localhost:1", True),  # browsers resolve *.localhost to loopback themselves
        ("127.0.0.1", (), "127.0.0.1:9000", True),  # any port: a forward (ssh -L, docker -p) changes it
        ("127.0.0.1", (), "evil.example:8787", False),
        ("127.0.0.1", (), "127.0.0.1.evil.example", False),
        ("127.0.0.1", (), "10.0.0.5:8787", False),
        ("0.0.0.0", (), "10.0.0.5:8787", True),  # listening everywhere: any IP literal (rebinding needs a name)
        ("0.0.0.0", (), "toolproxy:8787", False),
        ("0.0.0.0", ("toolproxy",), "toolproxy:8787", True),
        ("::1", (), "[::1]:8787", True),
        ("gpu-box.lan", (), "gpu-box.lan:8787", True),  # the --host name itself
        ("127.0.0.1", ("*",), "evil.example", True),
    ],
)
def test_which_hosts_are_known(bind, allowed, host, ok):
    assert (Exposure(bind, allowed).refusal("GET", {"Host": host}) is None) == ok


@pytest.mark.parametrize(
    "method, origin, ok",
    [
        ("POST", None, True),  # SDK clients send no Origin
        ("POST", "http://localhost:3000", True),  # a page this machine serves
        ("POST", "http://127.0.0.1:8787", True),
        ("POST", "https://evil.example", False),
        ("POST", "null", False),  # a sandboxed frame, a file:// page
        ("POST", "chrome-extension://abc", False),
        ("DELETE", "https://evil.example", False),
        ("GET", "https://evil.example", True),  # not state-changing: the same-origin policy hides the answer
        ("OPTIONS", "https://evil.example", True),  # a preflight goes to the upstream as always
    ],
)
def test_origin_of_state_changing_calls(method, origin, ok):
    headers = {"Host": "127.0.0.1:8787", **({"Origin": origin} if origin else {})}
    assert (Exposure("127.0.0.1").refusal(method, headers) is None) == ok


def test_a_rebinding_page_reads_nothing_and_a_cross_site_post_reaches_nothing(served):
    fake, p = served("llamacpp", "--quiet", "--no-fingerprint")
    fake.replies.extend([text("first answer"), text("second answer")])
    port = urlsplit(p.url).port
    run_path = urlsplit(p.url).path
    body = json.dumps({"model": fake.model, "messages": MSGS}).encode()
    good = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json"}
    status, _ = call(p.url, "POST", run_path + "/v1/chat/completions", good, body)
    assert status == 200
    (rec,) = p.wait_records(1)

    evil = f"evil.example:{port}"  # what a page on evil.example sends once its name points here
    for path in ("/_toolproxy/live", f"/_toolproxy/exchange/{rec['id']}", "/_toolproxy/stats", "/_toolproxy/"):
        status, answer = call(p.url, "GET", path, {"Host": evil, "Accept": "text/html"})
        assert status == 403 and b"the prompt" not in answer and b"--allowed-host" in answer, (path, answer)
    status, answer = call(
        p.url, "POST", run_path + "/v1/chat/completions", {"Host": evil, "Content-Type": "application/json"}, body
    )
    assert status == 403 and json.loads(answer)["error"]["code"] == "host_not_allowed"

    # A cross-site form POST (text/plain needs no preflight) from a page the user merely opened.
    status, answer = call(
        p.url,
        "POST",
        run_path + "/v1/chat/completions",
        {**good, "Content-Type": "text/plain", "Origin": "https://evil.example"},
        body,
    )
    assert status == 403 and json.loads(answer)["error"]["code"] == "origin_not_allowed"
    assert len(fake.seen) == 1  # neither refused request reached the model

    # The proxy's own names still work, for the page and for the model API.
    deadline = time.monotonic() + 120
    while True:
        status, answer = call(p.url, "GET", f"/_toolproxy/exchange/{rec['id']}", {"Host": f"localhost:{port}"})
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200 and b"the prompt" in answer
    status, _ = call(
        p.url, "POST", run_path + "/v1/chat/completions", {**good, "Origin": f"http://localhost:{port}"}, body
    )
    assert status == 200 and len(fake.seen) == 2

    recs = p.wait_records(4)
    refused = sorted(r["error_kind"] for r in recs if r["client_status"] == 403)
    assert refused == ["host_refused", "origin_refused"]  # recorded like every refusal
    exposure = p.proxy.stats()["exposure"]
    assert exposure["checked"] and exposure["refused_host"] >= 5 and exposure["refused_origin"] >= 1


def test_allowed_host_admits_a_name_and_star_turns_the_check_off(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    named = proxy(fake.url, "--quiet", "--no-fingerprint", "--allowed-host", "gpu-box.lan")
    off = proxy(fake.url, "--quiet", "--no-fingerprint", "--allowed-host", "*")
    for p, elsewhere in ((named, 403), (off, 200)):
        port = urlsplit(p.url).port
        assert call(p.url, "GET", "/_toolproxy/stats", {"Host": f"gpu-box.lan:{port}"})[0] == 200
        assert call(p.url, "GET", "/_toolproxy/stats", {"Host": f"evil.example:{port}"})[0] == elsewhere
    assert named.stats()["exposure"]["allowed_hosts"] == ["gpu-box.lan"]
    assert off.stats()["exposure"]["checked"] is False


def test_a_bad_allowed_host_is_a_usage_error(tmp_path):
    from proxyprocess import toolproxy_cli

    r = toolproxy_cli(
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--data",
        str(tmp_path),
        "--allowed-host",
        "http://gpu-box.lan:8787",
        timeout=60,
    )
    assert r.returncode == 2 and "--allowed-host" in r.stderr and "host name or an IP address" in r.stderr
    assert "Traceback" not in r.stderr


async def test_a_slow_login_form_is_timed_out_and_a_large_one_refused(fake_stack, proxy):
    """200 clients trickling the login form must not keep 200 handlers for ever: the form is
    read within --client-body-timeout, and at most 4 KiB of it."""
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--auth-token", "tok", "--client-body-timeout", "1")
    u = urlsplit(p.url)

    async def slow_form() -> bytes:
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        writer.write(
            f"POST /_toolproxy/login HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: "
            "application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=".encode()
        )
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()

    started = time.monotonic()
    answers = await asyncio.gather(*(slow_form() for _ in range(200)))
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}
    assert time.monotonic() - started < 9

    big = b"token=" + b"x" * 5000
    status, _ = call(
        p.url, "POST", "/_toolproxy/login", {"Host": u.netloc, "Content-Type": "application/x-www-form-urlencoded"}, big
    )
    assert status == 413
    # The form itself still works.
    status, _ = call(
        p.url,
        "POST",
        "/_toolproxy/login",
        {"Host": u.netloc, "Content-Type": "application/x-www-form-urlencoded"},
        b"token=tok",
    )
    assert status == 303


def test_parser_errors_print_no_secret_and_no_control_character(served):
    """aiohttp rejects these before the proxy sees them, and logs what it rejected: the secret
    header value, the query's key and the escape sequence must not reach stderr as sent."""
    import socket

    fake, p = served("llamacpp", "--quiet", "--no-fingerprint")
    u = urlsplit(p.url)
    bad = [
        b"GET /v1/models?key=sk-QUERY-SECRET-1 HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-HEADER-SECRET-2\x01z\r\n\r\n",
        b"GET /v1/models?api_key=sk-QUERY-SECRET-3 HT\x1b[2JTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: sk-HEADER-SECRET-4\r\n\r\n",
        b"GET /?token=sk-QUERY-SECRET-5" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    for raw in bad:
        with socket.create_connection((u.hostname, u.port), timeout=10) as s:
            s.sendall(raw)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        # the 400 names what was wrong, without the bytes aiohttp quotes: a key, or what else was sent
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0], answer
        assert b"SECRET" not in answer and b"\x1b" not in answer and b"400 Bad Request: " in answer, answer
    deadline = time.monotonic() + 120
    while p.proxy.output().count("refused a malformed request") < len(bad) and time.monotonic() < deadline:
        time.sleep(0.05)
    err = p.proxy.output()
    assert err.count("refused a malformed request") == len(bad), err
    for n in range(1, 6):
        assert f"SECRET-{n}" not in err, err
    assert "\x1b" not in err and "\x01" not in err and "Traceback" not in err
    assert "X-Api-Key: redacted:" in err and "key=redacted:" in err  # still says what was wrong where


def test_the_redaction_key_is_created_with_the_data_dir(fake_stack, proxy):
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet", "--no-fingerprint")
    assert (p.data / "redact.key").stat().st_mode & 0o777 == 0o600
    with urllib.request.urlopen(p.url + "/_toolproxy/health", timeout=5) as r:
        assert r.status == 200
