"""What one running proxy holds: its settings, writer, upstream session, addons and timers.

Kept apart from the handler (`forward`) and the addons so that each of them imports this module
and none imports another: the addons receive what they need when they are built.
"""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from toolproxy import __version__
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.counters import Counters
from toolproxy.proxy.exposure import Exposure
from toolproxy.proxy.flow import Hooks
from toolproxy.proxy.headers import load_redactor
from toolproxy.proxy.pool import PoolStats
from toolproxy.proxy.refusals import RefusalBudget
from toolproxy.proxy.stackwatch import StackWatch
from toolproxy.proxy.upstreamhealth import UpstreamHealth
from toolproxy.proxy.watchdog import Watchdog
from toolproxy.record.model import McpRecord, Record
from toolproxy.record.writer import SegmentWriter

SPILL_DIR = "spill"
# /_toolproxy/stats after its head (status, version, upstream, data_dir, condition): each key
# filled by the addon whose stats_key it is, null when no addon fills it (the feature is off).
STATS_KEYS = (
    "stack",
    "uptime_s",
    "exchanges",
    "in_flight",
    "by_status_class",
    "errors",
    "resent",
    "refused",
    "recording",
    "exposure",
    "upstream_pool",
    "lifecycle",
    "sampling",
    "otlp",
)


class ProxyState:
    def __init__(self, config: ProxyConfig, writer: SegmentWriter) -> None:
        self.config = config
        self.writer = writer
        # Where bodies above --spill-above wait while they pass: beside the segments, on the same disk.
        self.spill_dir = str(config.data_dir / SPILL_DIR)
        self.session: aiohttp.ClientSession | None = None
        self.pool = PoolStats(config.upstream_connections)
        self.watchdog = Watchdog()
        self.hooks = Hooks()
        self.started = time.time()
        # What each exchange is recorded as: an MCP server's traffic under `toolproxy mcp --upstream`.
        self.record_type: type[Record] = McpRecord if config.mcp_server is not None else Record
        self.counters = Counters()
        self.redactor = load_redactor(config.data_dir)
        self.exposure = Exposure(config.host, config.allowed_hosts)
        # Whether the upstream answers: reported beside recording health, never deciding its status.
        self.upstream_health = UpstreamHealth(config.upstream, config.connect_timeout)
        # Fingerprinting the upstream's stack (unless --no-fingerprint): the conditions, the OTLP
        # spans and the commands ask it which stack it found.
        self.stacks = (
            StackWatch(config, writer, lambda: self.session, self.upstream_health) if config.fingerprint else None
        )
        # Set by the parts that own them as they are built (proxy/parts.py): what the handler, the
        # admin routes and the commands ask for by name.
        self.live = None  # the live page's view (toolproxy.live), unless --no-live-page
        self.refusals: RefusalBudget | None = None
        # Under `serve --workers N`: this process's place in the group, whose stats it merges.
        self.peers = None

    def user_interrupted(self, how: str) -> int:
        """The user stopped the harness (`run` and `study` call this on Ctrl-C, before the harness
        sees the signal): every exchange in flight now ends as the user's cut (USER_INTERRUPT),
        not as a client that hung up on its own. How many were in flight."""
        for flow in self.watchdog.active:
            flow.cut_by_user = how
        return len(self.watchdog.active)

    def snapshot(self) -> dict:
        owned: dict = {"uptime_s": round(time.time() - self.started, 3)}
        for addon in self.hooks.addons:
            owned.update(addon.stats())
        return {
            "status": "degraded" if self.writer.stats.degraded else "ok",
            "version": __version__,
            "upstream": self.config.upstream,
            "data_dir": str(self.config.data_dir),
            "condition": self.config.condition,
            **{key: owned.pop(key, None) for key in STATS_KEYS},
            **owned,
        }


STATE: web.AppKey[ProxyState] = web.AppKey("toolproxy_state")
