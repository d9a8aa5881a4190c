"""Run / episode / item / condition tags for harnesses that can only change their base URL.

`/t/run=qwen-native/episode=3/item=bfcl_12/v1/chat/completions` -> tags + `/v1/chat/completions`.
Any subset of keys in any order; keys other than the known ones are kept as free-form tags (a
`category=` tag, for example, feeds `compare --by category`).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from toolproxy.proxy.headers import TAG_HEADER_PREFIX

KNOWN = ("run", "episode", "item", "condition")
_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


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


def header_tags(items) -> dict[str, str]:
    """Tags from X-Toolproxy-Run / -Episode / -Item / -Condition / -Tag-<key> headers."""
    tags = {}
    for k, v in items:
        lk = k.lower()
        if not lk.startswith(TAG_HEADER_PREFIX):
            continue
        name = lk[len(TAG_HEADER_PREFIX):]
        if name in KNOWN:
            tags[name] = v
        elif name.startswith("tag-") and len(name) > 4:
            tags[name[4:]] = v
    return tags
