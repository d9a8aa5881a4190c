"""One rule decides which header and query parameter names are secrets; their values are
replaced by keyed stand-ins."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import stat

import pytest

from toolproxy.proxy.headers import REDACT_KEY, Redactor, is_secret_name, load_redactor

R = Redactor(b"r" * 32)
redact_value = R.value

SECRET = [
    "Authorization",
    "Proxy-Authorization",
    "Cookie",
    "Set-Cookie",
    "x-api-key",
    "api-key",
    "api_key",
    "apiKey",
    "X-Goog-Api-Key",
    "key",
    "X-Auth",
    "auth",
    "X-Auth-Token",
    "access_token",
    "accessToken",
    "oauth_token",
    "client_secret",
    "X-Secret",
    "password",
    "passwd",
    "session",
    "X-Session-Id",
    "sig",
    "signature",
    "X-Amz-Signature",
    "private_key",
    "credentials",
    "jwt",
    "pwd",
]
NOT_SECRET = [
    "Content-Type",
    "Accept",
    "User-Agent",
    "X-Request-Id",
    "alt",
    "model",
    "keyword",
    "monkey",
    "signal",
    "design",
    "q",
    "stream",
    "X-Stainless-Lang",
    "OpenAI-Beta",
    "anthropic-version",
]


@pytest.mark.parametrize("name", SECRET)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET)
def test_ordinary_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "query, expected",
    [
        ("", ""),
        ("alt=json", "alt=json"),
        ("flag", "flag"),
        ("key=K1&alt=json", f"key={redact_value('K1')}&alt=json"),
        ("auth=A%20B&q=x%2Fy+z", f"auth={redact_value('A B')}&q=x%2Fy+z"),  # decoded before hashing
        ("auth=A+B", f"auth={redact_value('A B')}"),
        ("X-Api-Key=K&x-api-key=K", f"X-Api-Key={redact_value('K')}&x-api-key={redact_value('K')}"),
        ("token=%FF", "token=" + redact_value(bytes([255]))),
        ("a=1&&b=2&token", "a=1&&b=2&token"),
    ],
)
def test_redact_query(query, expected):
    assert R.query(query) == expected


def test_recorded_headers_keep_every_byte_and_hash_secrets_by_their_wire_bytes():
    raw = [(b"X-Note", b"caf\xe9"), (b"X-Utf8", b"caf\xc3\xa9"), (b"X-Api-Key", b"k\xe9y")]
    got = R.record_headers(raw)
    assert [[k, v] for k, v in got[:2]] == [["X-Note", "caf\xe9"], ["X-Utf8", "caf\xc3\xa9"]]
    assert [v.encode("latin-1") for _, v in got[:2]] == [b"caf\xe9", b"caf\xc3\xa9"]
    assert got[2] == ["X-Api-Key", redact_value(b"k\xe9y")]


def test_stand_ins_are_keyed_so_a_guess_cannot_be_checked_without_the_key():
    """An unkeyed hash of a low-entropy secret (a Basic password) is checked offline by hashing
    guesses; the stand-in is an HMAC under the data directory's key."""
    password = b"Basic YWxpY2U6aHVudGVyMg=="  # alice:hunter2
    stand_in = R.value(password)
    assert stand_in != "redacted:" + hashlib.sha256(password).hexdigest()[:8]
    assert stand_in == R.value(password) != Redactor(b"s" * 32).value(password)  # the key decides
    assert R.value(b"other") != stand_in  # and keys are still told apart


def _stand_in(data_dir, out):
    out.put(load_redactor(data_dir).value("sk-same"))


def test_the_key_is_private_and_the_same_for_every_process_of_a_data_dir(tmp_path):
    """Workers starting at one moment race to create the key; all must end with one key (a file
    that is read while half written would be a different key, or an error)."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_stand_in, args=(tmp_path, out)) for _ in range(8)]
    for p in procs:
        p.start()
    got = {out.get(timeout=30) for _ in procs}
    for p in procs:
        p.join(30)
    assert len(got) == 1 and got == {load_redactor(tmp_path).value("sk-same")}
    assert stat.S_IMODE(os.stat(tmp_path / REDACT_KEY).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == [REDACT_KEY]  # no temporary file left behind
