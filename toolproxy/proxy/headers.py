"""How secrets are kept off disk: which header and query names hold one, and the stand-ins
recorded for their values."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import sys
from collections.abc import Iterable
from urllib.parse import unquote_plus, unquote_to_bytes

from toolproxy.record import keys

# One rule for every name that can carry a credential, header or query parameter alike: a name is
# secret when it contains one of these words anywhere (`X-Goog-Api-Key`, `accessToken`,
# `client_secret`, `oauth_token`, `auth`) or one of its parts, split at `-`, `_` or `.`, is exactly
# one of the short words (`key`, `sig`), which are too common as substrings (`keyword`, `signal`).
_SECRET_WORD = re.compile(r"auth|cookie|api[-_.]?key|token|secret|passw|session|credential|private[-_.]?key", re.I)
_SECRET_PART = frozenset({"key", "sig", "signature", "pass", "pwd", "jwt"})
_PART_SPLIT = re.compile(r"[-_.]")


def is_secret_name(name: str) -> bool:
    """Whether a header or query parameter of this name must never reach disk in clear."""
    return _SECRET_WORD.search(name) is not None or not _SECRET_PART.isdisjoint(_PART_SPLIT.split(name.lower()))


_secret_names: dict[str, bool] = {}


def is_secret_header(name: str) -> bool:
    # Memoised: the same few dozen header names recur on every request of the hot path.
    secret = _secret_names.get(name)
    if secret is None:
        secret = is_secret_name(name)
        if len(_secret_names) < 4096:
            _secret_names[name] = secret
    return secret


REDACT_KEY = "redact.key"


def load_redactor(data_dir: str | os.PathLike) -> Redactor:
    """The data directory's Redactor; with a key of this process alone when the directory cannot
    hold one (then nothing is recorded there either, and stand-ins differ only across restarts)."""
    try:
        os.makedirs(data_dir, exist_ok=True)
        return Redactor(keys.load_key(data_dir, REDACT_KEY))
    except (OSError, ValueError) as exc:
        print(
            f"toolproxy: cannot use {REDACT_KEY} in {data_dir} ({exc}); redacted values are keyed by this process only",
            file=sys.stderr,
            flush=True,
        )
        return Redactor(secrets.token_bytes(32))


class Redactor:
    """Stand-ins for secret values that tell keys apart without revealing them: `redacted:` and
    the first 8 hex of an HMAC-SHA256 of the value's bytes, under the data directory's key
    (`redact.key`, see record/keys.py). Unkeyed, a stored hash of a low-entropy secret (a Basic
    password, a short token) could be checked offline by anyone holding the recordings; keyed,
    only with the key. The same key across restarts and workers keeps one key's stand-in the same
    everywhere. Memoised (in memory only): a client sends the same key with every request, and
    an HMAC per request showed in profiles."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._memo: dict[str | bytes, str] = {}

    def value(self, value: str | bytes) -> str:
        out = self._memo.get(value)
        if out is None:
            raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
            out = "redacted:" + hmac.new(self.key, raw, hashlib.sha256).hexdigest()[:8]
            if len(self._memo) < 1024:
                self._memo[value] = out
        return out

    def headers(self, items: Iterable[tuple[str, str]]) -> list[list[str]]:
        return [[k, self.value(v) if is_secret_header(k) else v] for k, v in items]

    def record_headers(self, raw: Iterable[tuple[bytes, bytes]]) -> list[list[str]]:
        """Headers as a record stores them: the wire bytes read as ISO-8859-1, one character per
        byte, so any byte a client sends survives (`value.encode("latin-1")` gives it back), and
        secret values replaced by a stand-in of their wire bytes."""
        out = []
        for k, v in raw:
            name = k.decode("latin-1")
            out.append([name, self.value(v) if is_secret_header(name) else v.decode("latin-1")])
        return out

    def query(self, query: str) -> str:
        """Query strings carry keys too (e.g. `?key=` on hosted APIs); the same name rule as headers.

        Works on the raw `name=value` pieces so every other parameter keeps its exact spelling.
        """
        if not query or "=" not in query:
            return query
        parts = query.split("&")
        changed = False
        for i, part in enumerate(parts):
            name, sep, value = part.partition("=")
            if sep and is_secret_name(unquote_plus(name)):
                parts[i] = f"{name}={self.value(unquote_to_bytes(value.replace('+', ' ')))}"
                changed = True
        return "&".join(parts) if changed else query


# A value shorter than this is not looked for in recorded text: a variable named like a secret
# that holds `1` or `true` would otherwise replace every such character string.
MIN_SECRET_CHARS = 8
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+([A-Za-z0-9._~+/=-]{8,})")
_HEADER_ARG = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s*:\s*(.+)$", re.S)


# Named like a secret, holding none: the shell's working directories (`pwd`).
_NOT_SECRETS = frozenset({"PWD", "OLDPWD"})


def secret_env_values(environ) -> list[str]:
    """The values of the variables in `environ` named like a secret (GITHUB_TOKEN, OPENAI_API_KEY),
    longest first, so a value that contains another is replaced whole. A value that names an
    existing path is no secret but where one is kept (GOOGLE_APPLICATION_CREDENTIALS,
    SSH_AUTH_SOCK), and is left as it is."""
    found = {
        v
        for k, v in environ.items()
        if k not in _NOT_SECRETS and is_secret_name(k) and len(v) >= MIN_SECRET_CHARS and not _is_path(v)
    }
    return sorted(found, key=len, reverse=True)


def _is_path(value: str) -> bool:
    try:
        return value.startswith(("/", "~", ".")) and os.path.exists(os.path.expanduser(value))
    except (OSError, ValueError):
        return False


class SecretScrubber:
    """Keeps a process's secrets out of what is recorded of it: the values of its secret-named
    environment variables wherever they appear (an MCP server's command line, its stderr, the
    messages it exchanges), bearer and basic credentials, and the values of secret-named flags,
    `NAME=value` pairs and `Name: value` headers on a command line. Each becomes the Redactor's
    stand-in, so one secret keeps one stand-in everywhere."""

    def __init__(self, redactor: Redactor, values: list[str]) -> None:
        self.redactor = redactor
        self.values = values

    def text(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, self.redactor.value(value))
        return _BEARER.sub(lambda m: f"{m.group(1)} {self.redactor.value(m.group(2))}", text)

    def command(self, argv: list[str]) -> list[str]:
        out: list[str] = []
        secret_flag = False
        for arg in argv:
            if secret_flag and not arg.startswith("-"):
                out.append(self.redactor.value(arg))
                secret_flag = False
                continue
            secret_flag = False
            name, sep, value = arg.partition("=")
            bare = name.lstrip("-")
            header = _HEADER_ARG.match(arg)
            if sep and bare and " " not in bare and is_secret_name(bare):
                out.append(f"{name}={self.redactor.value(value)}")
            elif header is not None and is_secret_name(header.group(1)):
                out.append(f"{header.group(1)}: {self.redactor.value(header.group(2))}")
            else:
                if arg.startswith("-") and not sep and is_secret_name(bare):
                    secret_flag = True
                out.append(self.text(arg))
        return out
