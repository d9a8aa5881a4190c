"""The real proxy, started in-process on a free loopback port, for probes that must be recorded.

doctor and conformance send every probe through the same app `serve` runs, so each probe is an
ordinary record in the data dir (run `doctor`, `conformance-<condition>`), the analyzer can read
them, and conditions apply exactly as they would for a harness (by the `condition=` path tag).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import click
import orjson

from toolproxy import wire
from toolproxy.checks.reply import ProbeReply, read_reply
from toolproxy.conditions import ConditionOptions
from toolproxy.proxy.config import ConfigError, ProxyConfig
from toolproxy.proxy.flow import Addon, Flow
from toolproxy.proxy.server import start_proxy
from toolproxy.proxy.state import ProxyState
from toolproxy.record.model import Record
from toolproxy.stacks.fingerprint import Fingerprint
from toolproxy.term.connection_errors import explain


@dataclass(slots=True)
class ProbeExchange:
    """One probe's reply together with its record (what the proxy saw and did)."""

    reply: ProbeReply
    record: Record | None
    elapsed_s: float = 0.0
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def condition_skipped(self) -> str | None:
        note = self.record.condition_note if self.record is not None else None
        return note if note and note.startswith("skipped") else None


class LocalProxy(Addon):
    def __init__(self, url: str, state: ProxyState, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.state = state
        self.session = session
        self._waiting: dict[str, asyncio.Future] = {}
        self._ids = itertools.count(1)
        state.hooks.add(self)

    def response_end(self, flow: Flow) -> None:
        rec = flow.rec
        fut = self._waiting.pop(rec.tags.get("probe", ""), None)
        if fut is not None and not fut.done():
            fut.set_result(rec)

    error = response_end

    async def fingerprint(self, model: str | None) -> Fingerprint:
        return await self.state.stacks.fingerprint(model)

    async def post(self, path: str, body: dict, **tags: str) -> ProbeExchange:
        """POST a JSON body through the proxy, tagged; returns the reply and its record."""
        probe_id = f"{next(self._ids)}"
        prefix = "/t/" + "".join(f"{k}={v}/" for k, v in {**tags, "probe": probe_id}.items() if v is not None)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[probe_id] = fut
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            async with self.session.post(
                self.url + prefix.rstrip("/") + path,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
            ) as resp:
                status, raw = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._waiting.pop(probe_id, None)
            reply = read_reply(
                None, b"", "proxy_error", f"talking to the local proxy failed: {explain(exc, self.url).what}"
            )
            return ProbeExchange(reply, None, loop.time() - t0, tags)
        try:
            rec = await asyncio.wait_for(fut, 5.0)
        except TimeoutError:
            rec = None
        self._waiting.pop(probe_id, None)
        kind = rec.error_kind if rec is not None else None
        message = rec.error_message if rec is not None else None
        return ProbeExchange(
            read_reply(status, raw, kind, message, wire.family_of(path) or wire.CHAT), rec, loop.time() - t0, tags
        )


@contextlib.asynccontextmanager
async def local_proxy(
    upstream: str,
    data_dir: Path,
    run: str,
    *,
    upstream_key: str | None = None,
    stack: str | None = None,
    timeout: float = 300.0,
) -> AsyncIterator[LocalProxy]:
    """Start the proxy app on 127.0.0.1:0 in front of `upstream`; stop it (flushing records) on exit."""
    config = ProxyConfig(
        upstream=upstream,
        data_dir=data_dir,
        host="127.0.0.1",
        port=0,
        run=run,
        quiet=True,
        upstream_key=upstream_key,
        condition_options=ConditionOptions(stack=stack),
        connect_timeout=min(10.0, timeout),
        ttfb_timeout=timeout,
        idle_timeout=timeout,
    )
    proxy = await start_proxy(config)
    try:
        client_timeout = aiohttp.ClientTimeout(total=timeout + 30)
        async with aiohttp.ClientSession(timeout=client_timeout) as session:
            yield LocalProxy(proxy.url, proxy.state, session)
    finally:
        await proxy.stop()


def check_target(upstream: str, data_dir: Path) -> None:
    """The --upstream and --data checks `serve` makes, as usage errors, before anything starts."""
    try:
        ProxyConfig(upstream=upstream, data_dir=data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        raise click.UsageError(f"--data {data_dir}: cannot create it: {exc.strerror or exc}") from None
