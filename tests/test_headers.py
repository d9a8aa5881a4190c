"""One rule decides which header and query parameter names are secrets."""

from __future__ import annotations

import pytest

from toolproxy.proxy.headers import is_secret_name, record_headers, redact_query, redact_value

SECRET = [
    "Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "x-api-key", "api-key", "api_key", "apiKey",
    "X-Goog-Api-Key", "key", "X-Auth", "auth", "X-Auth-Token", "access_token", "accessToken", "oauth_token",
    "client_secret", "X-Secret", "password", "passwd", "session", "X-Session-Id", "sig", "signature",
    "X-Amz-Signature", "private_key", "credentials", "jwt", "pwd",
]
NOT_SECRET = [
    "Content-Type", "Accept", "User-Agent", "X-Request-Id", "alt", "model", "keyword", "monkey", "signal",
    "design", "q", "stream", "X-Stainless-Lang", "OpenAI-Beta", "anthropic-version",
]


@pytest.mark.parametrize("name", SECRET)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET)
def test_ordinary_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("query, expected", [
    ("", ""),
    ("alt=json", "alt=json"),
    ("flag", "flag"),
    ("key=K1&alt=json", f"key={redact_value('K1')}&alt=json"),
    ("auth=A%20B&q=x%2Fy+z", f"auth={redact_value('A B')}&q=x%2Fy+z"),  # decoded before hashing
    ("auth=A+B", f"auth={redact_value('A B')}"),
    ("X-Api-Key=K&x-api-key=K", f"X-Api-Key={redact_value('K')}&x-api-key={redact_value('K')}"),
    ("token=%FF", "token=" + redact_value(bytes([255]))),
    ("a=1&&b=2&token", "a=1&&b=2&token"),
])
def test_redact_query(query, expected):
    assert redact_query(query) == expected


def test_recorded_headers_keep_every_byte_and_hash_secrets_by_their_wire_bytes():
    raw = [(b"X-Note", b"caf\xe9"), (b"X-Utf8", b"caf\xc3\xa9"), (b"X-Api-Key", b"k\xe9y")]
    got = record_headers(raw)
    assert [[k, v] for k, v in got[:2]] == [["X-Note", "caf\xe9"], ["X-Utf8", "caf\xc3\xa9"]]
    assert [v.encode("latin-1") for _, v in got[:2]] == [b"caf\xe9", b"caf\xc3\xa9"]
    assert got[2] == ["X-Api-Key", redact_value(b"k\xe9y")]
