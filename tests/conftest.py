"""Shared fixtures: emulated upstream stacks, the real proxy as a subprocess, and its records.

    def test_x(fake_stack, proxy):
        fake = fake_stack("ollama")                      # started, fake.url set
        p = proxy(fake.url, "--durability", "sync")      # `toolproxy serve` subprocess, p.url set
        ... talk to p.url ...
        recs = p.records()                               # every record in its data dir

Fakes run on their own event loop thread, so sync clients (the openai SDK) and async tests
both work against them, and a test can inspect `fake.seen` at any time.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from proxyprocess import ProxyProcess
from toolproxy.testing.fakes import FakeStack

@pytest.fixture
def fake_stack():
    """Factory: fake_stack("vllm", tool_parser="hermes") -> a running FakeStack (fake.url)."""
    with ExitStack() as stack:

        def start(kind: str, **options) -> FakeStack:
            fake = FakeStack(kind, **options)
            stack.enter_context(fake.in_thread())
            return fake

        yield start


@pytest.fixture
def proxy(tmp_path):
    """Factory: proxy(upstream_url, *serve_args, data=None, env=None) -> a running ProxyProcess."""
    started: list[ProxyProcess] = []
    count = 0

    def start(upstream: str, *args: str, data: Path | None = None, env: dict | None = None) -> ProxyProcess:
        nonlocal count
        count += 1
        p = ProxyProcess(upstream, data or tmp_path / f"data{count}", args, env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
