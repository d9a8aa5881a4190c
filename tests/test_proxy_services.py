"""The proxy's services: one ordered list, started in order, stopped in reverse, only those started."""

from __future__ import annotations

import pytest

from toolproxy.proxy import app as proxy_app
from toolproxy.proxy.config import ProxyConfig


def _config(tmp_path, **options) -> ProxyConfig:
    return ProxyConfig(upstream="http://127.0.0.1:9", data_dir=tmp_path, quiet=True, **options)


def test_every_service_in_its_order(tmp_path):
    state = proxy_app.make_state(_config(tmp_path, mask=("email",), retain_seconds=60.0))
    assert [s.name for s in proxy_app.services(state)] == [
        "live view",
        "refusals writer",
        "writer",
        "spill masking",
        "housekeeper",
        "watchdog",
        "upstream health",
        "upstream session",
        "stack watch",
    ]


def test_only_what_is_asked_for(tmp_path):
    state = proxy_app.make_state(_config(tmp_path, live_page=False, fingerprint=False))
    assert [s.name for s in proxy_app.services(state)] == [
        "refusals writer",
        "writer",
        "watchdog",
        "upstream health",
        "upstream session",
    ]


async def test_a_start_that_fails_stops_what_started_in_reverse_and_nothing_else(tmp_path, monkeypatch):
    """The writers' threads must not outlive a proxy whose start failed half way (with two
    hand-written ladders, a failure in on_startup left everything started before it running)."""
    events = []
    made = proxy_app.services

    def traced(state):
        out = []
        for s in made(state):
            out.append(
                proxy_app.Service(
                    s.name,
                    _then(events, "start " + s.name, s.start),
                    _then(events, "stop " + s.name, s.stop),
                    s.off_loop,
                )
            )
        broken = next(i for i, s in enumerate(out) if s.name == "watchdog")
        out[broken] = proxy_app.Service("watchdog", _fail, out[broken].stop)
        return out

    monkeypatch.setattr(proxy_app, "services", traced)
    app = proxy_app.make_app(_config(tmp_path, live_page=False, fingerprint=False))
    app.freeze()
    with pytest.raises(RuntimeError, match="no watchdog"):
        await app.startup()
    await app.cleanup()
    assert events == ["start refusals writer", "start writer", "stop writer", "stop refusals writer"]


def _then(events: list, event: str, fn):
    def call():
        events.append(event)
        return fn()

    return call


def _fail() -> None:
    raise RuntimeError("no watchdog")
