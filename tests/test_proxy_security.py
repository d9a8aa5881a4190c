"""Secrets never reach disk, only the configured upstream is ever contacted, tokens guard the door."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from toolproxy.proxy.headers import load_redactor
from toolproxy.record.segments import list_segments

MSGS = [{"role": "user", "content": "hi"}]


def request(url: str, method: str, target: str, headers: dict | None = None, body: bytes | None = None):
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def on_disk(data: Path) -> bytes:
    return b"".join(p.read_bytes() for p in list_segments(data))


def test_secrets_are_forwarded_but_never_written(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url)  # not --quiet: the per-exchange log line must not leak either
    secrets = {
        "Authorization": "Bearer sk-SECRET-AUTH-111",
        "x-api-key": "SECRET-XAPI-222",
        "api-key": "SECRET-AZURE-333",
        "Cookie": "session=SECRET-COOKIE-444",
        "Proxy-Authorization": "Basic SECRET-PROXY-555",
    }
    body = json.dumps({"model": "gpt-4o-mini", "messages": MSGS}).encode()
    status, _ = request(
        p.url,
        "POST",
        "/v1/chat/completions?key=SECRET-QUERY-666&alt=json",
        {**secrets, "Content-Type": "application/json"},
        body,
    )
    assert status == 200
    seen = {k.lower(): v for k, v in fake.seen[-1].header_list}
    for name in ("authorization", "x-api-key", "api-key", "cookie"):
        assert seen[name] == secrets[{"authorization": "Authorization", "cookie": "Cookie"}.get(name, name)]
    assert "proxy-authorization" not in seen  # hop-by-hop: it was meant for us, not the upstream
    assert fake.seen[-1].query == "key=SECRET-QUERY-666&alt=json"
    (rec,) = p.wait_records(1)
    p.stop()
    disk = on_disk(p.data) + p.output().encode()
    for needle in (
        b"SECRET-AUTH-111",
        b"SECRET-XAPI-222",
        b"SECRET-AZURE-333",
        b"SECRET-COOKIE-444",
        b"SECRET-PROXY-555",
        b"SECRET-QUERY-666",
    ):
        assert needle not in disk, needle
    headers = {k.lower(): v for k, v in rec["request_headers"]}
    assert headers["authorization"].startswith("redacted:") and len(headers["authorization"]) == len("redacted:") + 8
    assert headers["x-api-key"] != headers["api-key"]  # different keys stay distinguishable
    # keyed by the data directory's key: a guess at a short secret cannot be checked offline
    assert headers["authorization"] == load_redactor(p.data).value(secrets["Authorization"])
    assert headers["authorization"] != "redacted:" + hashlib.sha256(secrets["Authorization"].encode()).hexdigest()[:8]
    assert "alt=json" in rec["query"] and "SECRET" not in rec["client_path"]


def test_upstream_key_is_injected_from_the_environment(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(
        fake.url,
        "--quiet",
        "--upstream-key-env",
        "TP_TEST_UPSTREAM_KEY",
        env={"TP_TEST_UPSTREAM_KEY": "sk-UPSTREAM-SECRET-777"},
    )
    openai.OpenAI(base_url=p.url + "/v1", api_key="harness-dummy").chat.completions.create(
        model="gpt-4o-mini", messages=MSGS
    )
    auth = [v for k, v in fake.seen[-1].header_list if k.lower() == "authorization"]
    assert auth == ["Bearer sk-UPSTREAM-SECRET-777"]
    p.wait_records(1)
    p.stop()
    assert b"UPSTREAM-SECRET-777" not in on_disk(p.data) + p.output().encode()


def test_upstream_key_env_must_be_set():
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--upstream-key-env",
            "TP_TEST_DEFINITELY_UNSET",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "TP_TEST_DEFINITELY_UNSET" in r.stderr and "Traceback" not in r.stderr


def test_auth_token(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--auth-token", "tok-SECRET-888")
    body = json.dumps({"model": "gpt-4o-mini", "messages": MSGS}).encode()
    ct = {"Content-Type": "application/json"}
    status, answer = request(p.url, "POST", "/v1/chat/completions", ct, body)
    assert status == 401 and "X-Toolproxy-Token" in json.loads(answer)["error"]["message"]
    assert request(p.url, "POST", "/v1/chat/completions", {**ct, "X-Toolproxy-Token": "wrong"}, body)[0] == 401
    assert request(p.url, "POST", "/v1/chat/completions", {**ct, "Authorization": "Bearer wrong"}, body)[0] == 401
    assert fake.seen == []  # refused requests never leave the proxy
    # The admin routes name the upstream and the data dir: behind the same token.
    assert p.health()[0] == 401
    assert request(p.url, "GET", "/_toolproxy/stats", {}, b"")[0] == 401
    status, answer = request(p.url, "GET", "/_toolproxy/stats", {"X-Toolproxy-Token": "tok-SECRET-888"}, b"")
    assert status == 200 and json.loads(answer)["upstream"] == fake.url
    # Every refusal is counted, the admin routes' too (the start-up health check was one).
    assert json.loads(answer)["refused"]["by_kind"] == {"unauthorized": 3, "admin_unauthorized": 3}

    assert (
        request(
            p.url,
            "POST",
            "/v1/chat/completions",
            {**ct, "X-Toolproxy-Token": "tok-SECRET-888", "Authorization": "Bearer sk-upstream"},
            body,
        )[0]
        == 200
    )
    seen = {k.lower(): v for k, v in fake.seen[-1].header_list}
    assert "x-toolproxy-token" not in seen and seen["authorization"] == "Bearer sk-upstream"

    r = openai.OpenAI(base_url=p.url + "/v1", api_key="tok-SECRET-888").chat.completions.create(
        model="gpt-4o-mini", messages=MSGS
    )
    assert r.choices[0].message.content
    assert "authorization" not in {k.lower() for k, _ in fake.seen[-1].header_list}  # the token is ours, not theirs

    # Refusals have segments of their own: in the order they happened, by id.
    recs = sorted(p.wait_records(5), key=lambda r: r["id"])
    assert [r["client_status"] for r in recs] == [401, 401, 401, 200, 200]
    assert [r["error_kind"] for r in recs[:3]] == ["unauthorized"] * 3
    p.stop()
    assert b"tok-SECRET-888" not in on_disk(p.data)


def test_the_token_as_the_api_key_in_each_sdks_own_header(fake_stack, proxy):
    """Anthropic's API takes its key as x-api-key (curl examples, older SDKs and other clients send
    it so), Azure OpenAI's as api-key, Gemini's as x-goog-api-key: the token works in each, and
    stays with the proxy."""
    fake = fake_stack("llamacpp")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--auth-token", "tok-SECRET-888")
    body = json.dumps({"model": "m", "max_tokens": 16, "messages": MSGS}).encode()
    ct = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    assert request(p.url, "POST", "/v1/messages", {**ct, "x-api-key": "wrong"}, body)[0] == 401
    for name in ("x-api-key", "api-key", "x-goog-api-key"):
        status, answer = request(p.url, "POST", "/v1/messages", {**ct, name: "tok-SECRET-888"}, body)
        assert status == 200 and json.loads(answer)["content"], (name, answer)
        assert name not in {k.lower() for k, _ in fake.seen[-1].header_list}
    assert [s.path for s in fake.seen] == ["/v1/messages"] * 3
    p.stop()
    assert b"tok-SECRET-888" not in on_disk(p.data)


def test_non_loopback_bind_without_token_is_refused_clearly(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolproxy.cli import main; main()",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--data",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert "non-loopback" in r.stderr and "--auth-token" in r.stderr and "Traceback" not in r.stderr


def test_absolute_form_target_and_host_header_cannot_redirect(fake_stack, proxy):
    upstream = fake_stack("vllm")
    attacker = fake_stack("openai")
    p = proxy(upstream.url, "--quiet")
    evil = urlsplit(attacker.url).netloc

    u = urlsplit(p.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(f"GET {attacker.url}/v1/models HTTP/1.1\r\nHost: {evil}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"not_a_forward_proxy" in answer

    status, body = request(
        p.url, "GET", "/v1/models", {"Host": evil, "X-Forwarded-Host": evil, "Forwarded": f"host={evil}"}
    )
    assert status == 200 and b'"owned_by":"vllm"' in body  # answered by the configured upstream
    request(p.url, "GET", f"//{evil}/v1/models")  # a scheme-relative path is still a path on the upstream
    assert attacker.seen == []
    assert [s.path for s in upstream.seen][:1] == ["/v1/models"]
    host = {k.lower(): v for k, v in upstream.seen[0].header_list}["host"]
    assert host == urlsplit(upstream.url).netloc
    stats = p.stats()  # the refused request went through the counters like any other
    assert stats["in_flight"] == 0 and stats["errors"]["not_a_forward_proxy"] == 1
    assert stats["refused"]["by_kind"] == {"not_a_forward_proxy": 1} and stats["refused"]["recorded"] == 1


def test_admin_routes_are_never_forwarded_or_recorded(fake_stack, proxy):
    fake = fake_stack("ollama", models={"qwen2.5:7b": ("completion", "tools"), "gemma3:latest": ("completion",)})
    p = proxy(fake.url, "--quiet", "--no-fingerprint")  # exact record counts below: exchanges only
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    client = openai.OpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0)
    client.chat.completions.create(model="qwen2.5:7b", messages=MSGS)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gemma3", messages=MSGS, tools=tools)
    status, health = p.health()
    assert status == 200 and health["status"] == "ok" and health["upstream"] == fake.url
    stats = p.stats()
    assert stats["exchanges"] == 2 and stats["by_status_class"] == {"2xx": 1, "4xx": 1}
    assert stats["in_flight"] == 0 and stats["recording"]["dropped"] == 0
    assert request(p.url, "GET", "/_toolproxy/nope")[0] == 404
    assert [s.path for s in fake.seen] == ["/v1/chat/completions", "/v1/chat/completions"]
    assert len(p.wait_records(2)) == 2
    assert p.wait_written(2)["recording"]["written"] == 2


async def test_a_token_that_is_not_utf8_is_a_401_not_a_500(fake_stack, proxy):
    from rawhttp import raw_request

    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--auth-token", "tok-SECRET-888")
    body = json.dumps({"model": "gpt-4o-mini", "messages": MSGS}).encode()
    for header in ((b"X-Toolproxy-Token", b"tok-\xff\xfe"), (b"Authorization", b"Bearer tok-\xe9")):
        status, answer = await raw_request(p.url, b"/v1/chat/completions", [header], body)
        assert status == 401 and b"toolproxy_unauthorized" in answer, answer
    assert fake.seen == []
    recs = p.wait_records(2)
    assert [r["client_status"] for r in recs] == [401, 401] and [r["error_kind"] for r in recs] == ["unauthorized"] * 2


def test_query_secrets_follow_the_header_rules(fake_stack, proxy):
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--no-fingerprint")
    query = (
        "x-api-key=SECRET-Q1&auth=SECRET-Q2&access_token=SECRET-Q3&client_secret=SECRET-Q4"
        "&apiKey=SECRET-Q5&sig=SECRET-Q6&alt=json&keyword=caf%C3%A9+au+lait&q=a%2Fb"
    )
    body = json.dumps({"model": "gpt-4o-mini", "messages": MSGS}).encode()
    status, _ = request(p.url, "POST", "/v1/chat/completions?" + query, {"Content-Type": "application/json"}, body)
    assert status == 200 and "SECRET-Q1" in fake.seen[-1].query and "SECRET-Q6" in fake.seen[-1].query  # forwarded
    (rec,) = p.wait_records(1)
    p.stop()
    disk = on_disk(p.data)
    for i in range(1, 7):
        assert f"SECRET-Q{i}".encode() not in disk
    # Every other parameter keeps its exact spelling.
    assert rec["query"].endswith("&alt=json&keyword=caf%C3%A9+au+lait&q=a%2Fb")
    assert rec["query"].split("&")[0] == "x-api-key=" + load_redactor(p.data).value("SECRET-Q1")
