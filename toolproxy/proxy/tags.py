"""Run / episode / item / condition tags for harnesses that can only change their base URL.

`/t/run=qwen-native/episode=3/item=bfcl_12/v1/chat/completions` -> tags + `/v1/chat/completions`.
Any subset of keys in any order; keys other than the known ones are kept as free-form tags (a
`category=` tag, for example, feeds `compare --by category`).

Base URLs end in `/v1` by convention, so a harness given one often puts the `/v1` on the wrong side
of the tags: `/v1/t/run=x/chat/completions` (the proxy's address with `/v1`, then the tags) or
`/t/run=x/v1/v1/chat/completions` (a client that appends `/v1/...` itself). `place_path_tags` takes
these where only one reading exists, rather than forwarding a path no stack serves and recording the
run as untagged.

`tag_prefix` writes the prefix (run, study, replay and playback's relay tag their requests with it).
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from toolproxy.proxy.flow import Refusal

KNOWN = ("run", "episode", "item", "condition")
_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
TAG_HEADER_PREFIX = "x-toolproxy-"  # X-Toolproxy-Run, ...: the same tags as headers, never forwarded


def tag_prefix(run: str | None = None, condition: str | None = None, **tags: str) -> str:
    """The `/t/key=value/...` path prefix the proxy strips and records (empty when no tags)."""
    pairs = [("run", run), ("condition", condition), *sorted(tags.items())]
    parts = [f"{k}={quote(str(v), safe='')}" for k, v in pairs if v]
    return "/t/" + "/".join(parts) if parts else ""


def split_path_tags(path: str) -> tuple[dict[str, str], str]:
    """(tags, forwarded path) for a raw path without its query string."""
    if not path.startswith("/t/"):
        return {}, path
    tags: dict[str, str] = {}
    parts = path[3:].split("/")
    i = 0
    while i < len(parts):
        key, sep, value = parts[i].partition("=")
        if not sep or not _KEY.match(key):
            break
        tags[key.lower()] = unquote(value)
        i += 1
    rest = "/" + "/".join(parts[i:])
    return tags, rest


# What OpenAI-style clients append to a base URL that ends in /v1; Ollama's clients append /api/...
# to a base without it. A tagged path after a misplaced /v1 is put right only when it is one of these.
_UNDER_V1 = frozenset({"/chat/completions", "/completions", "/responses", "/messages", "/models", "/embeddings"})


def place_path_tags(path: str) -> tuple[dict[str, str], str, str | None]:
    """(tags, forwarded path, None) with a `/v1` misplaced around the tags put right; or ({},
    path, the tag prefix as written) for tags after a `/v1` followed by a path of no one reading
    (`/v1/t/run=x/completion`: llama.cpp's own, or a typo?), so the caller can name the base URL."""
    if path.startswith("/v1/t/"):
        tags, rest = split_path_tags(path[3:])
        if not tags:
            return {}, path, None
        if rest.rstrip("/") in _UNDER_V1:
            rest = "/v1" + rest
        elif not rest.startswith(("/v1/", "/api/")):
            return {}, path, path[3 : len(path) - len(rest)]
    else:
        tags, rest = split_path_tags(path)
    while tags and rest.startswith("/v1/v1/"):
        rest = rest[3:]
    return tags, rest, None


def misplaced_refusal(host: str, prefix: str, asked: str, family: str | None) -> Refusal:
    """The 404 for tags after a misplaced `/v1` (place_path_tags), naming the base URL to use,
    in the protocol's error shape so the harness shows it."""
    base = f"http://{host}{prefix}"
    return Refusal(
        404,
        "misplaced_tags",
        f"the tags go right after the proxy's address, before /v1: use the base URL {base}/v1 (OpenAI-style "
        f"clients) or {base} (Ollama's); this request asked for {asked}",
        "toolproxy_misplaced_tags",
        family,
    )


def header_tags(items) -> dict[str, str]:
    """Tags from X-Toolproxy-Run / -Episode / -Item / -Condition / -Tag-<key> headers."""
    tags = {}
    for k, v in items:
        lk = k.lower()
        if not lk.startswith(TAG_HEADER_PREFIX):
            continue
        name = lk[len(TAG_HEADER_PREFIX) :]
        if name in KNOWN:
            tags[name] = v
        elif name.startswith("tag-") and len(name) > 4:
            tags[name[4:]] = v
    return tags


class BadTag(ValueError):
    """A `--tag` value that is not KEY=VALUE; the message says so. Commands raise it as a usage error."""


def parse_tags(tags: tuple[str, ...]) -> dict[str, str]:
    """`--tag KEY=VALUE` options (run's, study's, mcp's) as tags; BadTag for a malformed one."""
    out = {}
    for t in tags:
        key, sep, value = t.partition("=")
        if not sep or not key or "/" in key or "/" in value:
            raise BadTag(f"{t!r}: expected KEY=VALUE without '/'")
        out[key] = value
    return out
