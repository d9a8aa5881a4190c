"""Interface conditions (docs/conditions.md): a request rewrite paired with a response synthesis.

`native` is the identity and never reaches this package: the proxy's hot path forwards bytes
untouched. Every other condition is a module `toolproxy.conditions.<name>` exposing CONDITION, an
object with `prepare(request: RequestView, options: ConditionOptions) -> Plan | Skip | Reject`.

A Plan says what goes upstream instead (path, body, header overrides) and carries a
ResponseTransform that turns the upstream's response into what the harness gets, chunk by chunk,
so a streaming harness still receives a stream. A Skip says why the condition could not apply;
the proxy then forwards the request unchanged and records the reason. A Reject is for a request
the condition must not forward at all (a chat template that fails to render it): the proxy
answers with that status and message itself, and records it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

NAMES = ("native", "hint", "text", "constrained", "template")


@dataclass(frozen=True, slots=True)
class RequestView:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(slots=True)
class ConditionOptions:
    """Per-proxy settings the conditions read (from `toolproxy serve` flags)."""

    stack: str | None = None
    chat_template: str | None = None
    parser: str | None = None
    constrained_forced: bool = False
    # Protocols (wire families: "responses", "messages") translated to chat completions for an
    # upstream that only speaks chat (`serve --bridge`), and their replies translated back.
    bridge: frozenset[str] = frozenset()
    extra: dict[str, Any] = field(default_factory=dict)


class ResponseTransform(Protocol):
    def start(self, status: int, headers: Mapping[str, str]) -> tuple[int, list[tuple[str, str]]]:
        """Status and headers for the client, given the upstream's."""

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to send to the client now for this upstream chunk (may be empty)."""

    def finish(self) -> bytes:
        """Bytes to send once the upstream body has ended."""

    @property
    def note(self) -> str | None:
        """What the transform did (e.g. calls found), recorded with the exchange; None if nothing to say."""


@dataclass(slots=True)
class Plan:
    path: str
    body: bytes
    transform: ResponseTransform | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Skip:
    reason: str


@dataclass(frozen=True, slots=True)
class Reject:
    status: int
    message: str


class Condition(Protocol):
    name: str

    def prepare(self, request: RequestView, options: ConditionOptions) -> Plan | Skip | Reject: ...


def load(name: str) -> Condition:
    """The condition object for a name; raises ValueError for an unknown name."""
    if name not in NAMES or name == "native":
        raise ValueError(f"unknown condition {name!r}; choose one of {', '.join(NAMES)}")
    return importlib.import_module(f"toolproxy.conditions.{name}").CONDITION
