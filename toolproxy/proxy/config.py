"""Everything `toolproxy serve` can be told, validated once at start."""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from yarl import URL

from toolproxy.conditions import NAMES, ConditionOptions

_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?\.?|\[?[0-9A-Fa-f:.]+\]?")


# The limits every command that listens holds a client to (playback too, which has no options for them).
MAX_BODY = 64 * 1024 * 1024
CLIENT_HEADER_TIMEOUT = 15.0
CLIENT_BODY_TIMEOUT = 60.0
# The longest a recorded wait can have been under serve's defaults: for the first byte, between pieces.
TTFB_TIMEOUT = 600.0
IDLE_TIMEOUT = 300.0


class ConfigError(ValueError):
    """A setting a user must fix; the CLI prints it without a traceback."""


@dataclass
class ProxyConfig:
    upstream: str
    data_dir: Path = Path("toolproxy-data")
    host: str = "127.0.0.1"
    port: int = 8787
    run: str | None = None
    condition: str = "native"
    condition_options: ConditionOptions = field(default_factory=ConditionOptions)
    max_body: int = MAX_BODY
    # The largest response passed on (and recorded); above it the exchange is cut (proxy/recorder.py).
    max_response: int = 256 * 1024 * 1024
    # Bodies above this many bytes wait in a temporary file instead of memory (proxy/spool.py).
    spill_above: int = 1024 * 1024
    # Data lifecycle (record/housekeeping.py): delete segments older than retain_seconds; keep
    # segments under max_disk bytes by pruning the oldest ("prune") or refusing traffic ("block").
    retain_seconds: float | None = None
    max_disk: int | None = None
    on_disk_full: str = "prune"
    # --mask: built-in set names or regular expressions (record/masking.py)
    mask: tuple[str, ...] = ()
    # --sample: the share of episodes recorded whole (record/sampling.py); None records all
    sample: float | None = None
    connect_timeout: float = 10.0
    # A CPU-only model can take minutes to read a long agent context before its first byte.
    ttfb_timeout: float = TTFB_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    total_timeout: float | None = None
    durability: str = "group"
    commit_window: float = 0.2
    on_record_failure: str = "serve"
    max_queue: int = 10_000
    segment_bytes: int = 64 * 1024 * 1024
    segment_seconds: float = 3600.0
    auth_token: str | None = None
    upstream_key: str | None = None
    insecure_public: bool = False
    # --allowed-host: names (and IPs) the Host and Origin checks accept besides the local ones; "*": no check
    allowed_hosts: tuple[str, ...] = ()
    quiet: bool = False
    # Probe the upstream's own endpoints at start and per new model (kind=fingerprint records).
    fingerprint: bool = True
    # Connections to the upstream; 0: as many as clients need (a cap is a queue, see proxy/pool.py).
    upstream_connections: int = 0
    # A client must send a complete request head within this many seconds of connecting (or of its
    # previous response), and never pause longer than client_body_timeout while sending a body.
    client_header_timeout: float = CLIENT_HEADER_TIMEOUT
    client_body_timeout: float = CLIENT_BODY_TIMEOUT
    # The /_toolproxy/ page and the classifier process behind it.
    live_page: bool = True
    # One span per exchange to this OTLP/HTTP receiver (toolproxy/otlp/), message content only if asked.
    otlp_endpoint: str | None = None
    otlp_content: bool = False
    # `toolproxy mcp --upstream URL`: the MCP server's name; its exchanges are recorded as MCP records.
    mcp_server: str | None = None

    def default_run(self, started_at: float) -> str | None:
        """The run of a request that names none: `--run`, its strftime fields (`%Y`, `%m`, `%d`,
        `%H`...) filled in from the request's start in UTC. `prod-%Y-%m-%d` starts a run a day:
        `analyze` derives a run whole, in memory, and again whenever it gains a record, so traffic
        that nobody tags is best cut into bounded runs."""
        if self.run is None or "%" not in self.run:
            return self.run
        return time.strftime(self.run, time.gmtime(started_at))

    def __post_init__(self) -> None:
        url = URL(self.upstream)
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(
                f"--upstream must be an http(s) URL with a host, e.g. http://127.0.0.1:11434 (got {self.upstream!r})"
            )
        if url.query_string or url.fragment:
            raise ConfigError("--upstream must not carry a query string or fragment")
        self.upstream = str(url.with_path(url.path.rstrip("/"))).rstrip("/")
        problem = version_suffix_problem(self.upstream)
        if problem:
            raise ConfigError(problem)
        if self.condition not in NAMES:
            raise ConfigError(f"--condition must be one of {', '.join(NAMES)} (got {self.condition!r})")
        if self.durability not in ("group", "sync"):
            raise ConfigError("--durability must be 'group' or 'sync'")
        if self.on_record_failure not in ("serve", "block"):
            raise ConfigError("--on-record-failure must be 'serve' or 'block'")
        if self.upstream_connections < 0:
            raise ConfigError("--upstream-connections must be 0 (no limit) or a positive number")
        if self.client_header_timeout <= 0 or self.client_body_timeout <= 0:
            raise ConfigError("--client-header-timeout and --client-body-timeout must be positive")
        if self.on_disk_full not in ("prune", "block"):
            raise ConfigError("--on-disk-full must be 'prune' or 'block'")
        if self.retain_seconds is not None and self.retain_seconds <= 0:
            raise ConfigError("--retain must be a positive duration")
        if self.max_disk is not None and self.max_disk < 2 * self.segment_bytes:
            raise ConfigError(
                f"--max-disk {self.max_disk} bytes is less than two segments (--segment-size {self.segment_bytes}): "
                "the "
                "segment being written cannot be pruned, so the budget could not hold; lower --segment-size or raise "
                "--max-disk"
            )
        if self.spill_above < 1024:
            raise ConfigError("--spill-above must be at least 1024 bytes")
        if self.run is not None:
            try:
                named = self.default_run(time.time())
            except ValueError as exc:
                raise ConfigError(f"--run {self.run!r} cannot name a run: {exc}") from None
            if not named:
                raise ConfigError(f"--run {self.run!r} names an empty run")
        if self.max_body < 1024:
            raise ConfigError("--max-body must be at least 1024 bytes")
        if self.max_response < 1024:
            raise ConfigError("--max-response must be at least 1024 bytes")
        for name in self.allowed_hosts:
            if name != "*" and not _HOST_NAME.fullmatch(name):
                raise ConfigError(
                    f"--allowed-host {name!r}: give a host name or an IP address (no scheme, port or "
                    "path), or '*' to turn the Host and Origin checks off"
                )
        if not is_loopback(self.host) and not self.auth_token and not self.insecure_public:
            raise ConfigError(
                f"refusing to listen on non-loopback address {self.host!r} without --auth-token: anyone who can "
                "reach it could use your upstream (and its key). Add --auth-token, or --insecure-public if you mean it."
            )


def version_suffix_problem(upstream: str) -> str | None:
    """Why an upstream ending in an API version (`/v1`) cannot work, or None.

    The proxy forwards each request's path as the harness sent it, appended to the upstream's own
    path, and harnesses send `/v1/chat/completions`, `/v1/messages` ...: an upstream ending in
    `/v1` would receive `/v1/v1/...` and answer 404. Refusing it loses nothing: an upstream `X/v1`
    with paths sent without `/v1` is the same as the upstream `X` with the paths as harnesses send
    them, and it keeps the proxy's own probes (`/props`, `/api/version`, `/v1/models`) right.
    A prefix that is not a version (`https://host/openai`, `https://host/api`) is kept and forwarded.
    """
    url = URL(upstream)
    path = url.path.rstrip("/")
    if not path.endswith("/v1"):
        return None
    root = str(url.with_path(path[: -len("/v1")] or "/")).rstrip("/")
    return (
        f"--upstream {upstream} ends in /v1; give it without that: --upstream {root}. Harnesses already send "
        "paths starting with /v1 (e.g. /v1/chat/completions) and the proxy forwards them as sent, so this "
        "upstream would get /v1/v1/... and answer 404. It is your harness's base URL that ends in /v1: the "
        "proxy's address followed by /v1."
    )


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
