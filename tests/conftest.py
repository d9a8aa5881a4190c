"""Shared fixtures: emulated upstream stacks, the real proxy as a subprocess, and its records.

    def test_x(fake_stack, proxy):
        fake = fake_stack("ollama")                      # started, fake.url set
        p = proxy(fake.url, "--durability", "sync")      # `toolproxy serve` subprocess, p.url set
        ... talk to p.url ...
        recs = p.records()                               # every record in its data dir

    def test_y(served):                                  # shared per module: one proxy per
        fake, p = served("ollama", "--condition", "text")  # (stack, options, serve args);
        ... talk to p.url ...                              # p.url carries this test's run tag,
        recs = p.wait_records(1)                           # and only its records come back

Fakes run on their own event loop thread, so sync clients (the openai SDK) and async tests
both work against them, and a test can inspect `fake.seen` at any time.
"""

from __future__ import annotations

import os
import random
import uuid
from contextlib import ExitStack
from pathlib import Path

import pytest
from proxyprocess import ProxyProcess, stop_in_background, wait_stopped

from toolproxy.emulators import FakeStack

FUZZ_SEED = "TOOLPROXY_FUZZ_SEED"


def pytest_configure(config):
    """One fuzz seed per session, drawn here (in the main process under pytest-xdist) so every
    worker fuzzes with the same seed and the one printed at the end replays the whole run."""
    if not hasattr(config, "workerinput") and not os.environ.get(FUZZ_SEED):
        os.environ[FUZZ_SEED] = str(random.SystemRandom().randrange(1 << 32))


def pytest_sessionfinish(session):
    wait_stopped()  # proxies stopped in the background by fixtures' teardowns


def pytest_terminal_summary(terminalreporter, config):
    if not hasattr(config, "workerinput") and any(
        r.nodeid.startswith("tests/test_fuzz.py")
        for rs in terminalreporter.stats.values()
        for r in rs
        if hasattr(r, "nodeid")
    ):
        seed = os.environ[FUZZ_SEED]
        terminalreporter.write_line(f"fuzz seed {seed}: replay with {FUZZ_SEED}={seed}")


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
    stop_in_background(started)


class Tagged:
    """One test's view of a shared proxy: its own run tag in the address, and only its records."""

    def __init__(self, proxy: ProxyProcess, run: str) -> None:
        self.proxy, self.run = proxy, run
        self.url = f"{proxy.url}/t/run={run}"

    def wait_records(self, n: int, timeout: float = 5.0) -> list[dict]:
        return self.proxy.wait_records(n, timeout, run=self.run)


@pytest.fixture(scope="module")
def _pool(tmp_path_factory):
    """Fakes and proxies started once per module, by (stack, fake options) and serve arguments."""
    fakes: dict[tuple, FakeStack] = {}
    proxies: dict[tuple, ProxyProcess] = {}
    with ExitStack() as stack:

        def get(kind: str, args: tuple[str, ...], options: dict) -> tuple[FakeStack, ProxyProcess]:
            fkey = (kind, repr(sorted(options.items())))
            if fkey not in fakes:
                fakes[fkey] = FakeStack(kind, **options)
                stack.enter_context(fakes[fkey].in_thread())
            if (fkey, args) not in proxies:
                proxies[fkey, args] = ProxyProcess(fakes[fkey].url, tmp_path_factory.mktemp("data"), args)
            proxy = proxies[fkey, args]
            if proxy.proc.poll() is not None:  # an earlier test of the module took it down
                raise RuntimeError(f"the module's shared proxy exited (rc={proxy.proc.returncode}):\n{proxy.output()}")
            return fakes[fkey], proxy

        try:
            yield get
        finally:  # told before the fakes go
            stop_in_background(proxies.values())


@pytest.fixture
def served(_pool):
    """served(stack, *serve_args, **fake_options) -> (fake, tagged proxy). The fake and the proxy
    are shared within the module; each test starts with an empty reply queue and request log on
    the fake and sees only the records of its own run tag, so tests stay independent."""
    count = 0

    def get(kind: str, *args: str, **options) -> tuple[FakeStack, Tagged]:
        nonlocal count
        count += 1
        fake, proxy = _pool(kind, args, options)
        fake.replies.clear()
        fake.faults.clear()
        fake.seen.clear()
        return fake, Tagged(proxy, f"{uuid.uuid4().hex[:12]}-{count}")

    return get
