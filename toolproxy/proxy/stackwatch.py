"""Fingerprint records while serving: once at start, then once per model name the traffic uses.

The hot path must not parse JSON, yet the model name is inside the request body. So the
addon's request hook does only a path comparison and appends the body to a bounded deque. A
background task takes the bodies from there, off the request's path, and finds the `"model"`
values with `str.find` (a C scan, no parse). Only a body holding a name not yet seen costs a
real parse, to make sure `"model"` is the top-level key and not, say, a tool argument.

Probing is bounded, because model names come from clients: one model at a time, at most one
new model every `PROBE_GAP` seconds, at most `MAX_MODELS` fingerprints kept. Names beyond
that are counted, not probed. Probing and recording happen in the background, so serving never
waits for them, and a slow or dead upstream only delays a fingerprint record, never a response.

A fingerprint that found the upstream unreachable is not kept as the answer: an upstream started a
moment after the proxy (a model server and `serve` launched back to back) is probed again when
traffic comes, at most once every `PROBE_GAP` seconds, so the stats name the stack once it answers.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import aiohttp
import orjson

from toolproxy.proxy.flow import Addon, Flow, Service
from toolproxy.proxy.upstreamhealth import UpstreamHealth
from toolproxy.record.writer import SegmentWriter
from toolproxy.stacks.catalog import STACKS, UNREACHABLE
from toolproxy.stacks.fingerprint import Fingerprint, fingerprint_record, probe

ATTEMPT_PATHS = ("/chat/completions", "/completions", "/api/chat", "/api/generate", "/v1/messages", "/responses")
_KEY = '"model"'
_MAX_PENDING = 256
MAX_MODELS = 32
# Characters of bodies scanned between yields to the loop: a yield per body (a step of this task
# per request) cost more than scanning a short body, and a long one still yields right after it.
SCAN_BATCH_CHARS = 64 * 1024
PROBE_GAP = 5.0


def model_candidates(body: str) -> set[str]:
    """Every string value that follows a `"model"` key anywhere in a JSON text, without parsing it.

    Inside a JSON string a quote is escaped, so an unescaped `"model"` followed by `:` is always a
    key; it may be nested, which is why a new candidate is confirmed by a parse before use.
    """
    found = set()
    i = body.find(_KEY)
    while i != -1:
        j = i + len(_KEY)
        while j < len(body) and body[j] in " \t\r\n":
            j += 1
        if j < len(body) and body[j] == ":":
            j += 1
            while j < len(body) and body[j] in " \t\r\n":
                j += 1
            if j < len(body) and body[j] == '"':
                end = body.find('"', j + 1)
                if end != -1 and end - j <= 256:
                    found.add(body[j + 1 : end])
        i = body.find(_KEY, i + 1)
    return found


def top_level_model(body: str) -> str | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None


class StackWatch(Addon):
    def __init__(
        self,
        config,
        writer: SegmentWriter,
        session: Callable[[], aiohttp.ClientSession],
        health: UpstreamHealth | None = None,
    ) -> None:
        self.config = config
        self.health = health  # told what each fingerprint found out about reachability
        self.writer = writer
        self.session = session
        self.fingerprints: dict[str | None, Fingerprint] = {}
        self.not_probed = 0
        self._probing: dict[str | None, asyncio.Task] = {}
        self._pending: collections.deque[str] = collections.deque(maxlen=_MAX_PENDING)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stack: str | None = None
        self._unreached = False  # the latest fingerprint found nothing answering: probe again on traffic

    stats_key = "stack"

    def service(self) -> Service:
        # In the background: serving starts now, whatever the upstream is doing. Its first
        # fingerprint is also the first word on whether the upstream is reachable.
        return Service("stack watch", self.start, self.stop)

    def start(self) -> None:
        first = self._start_probe(None)
        if self.health is not None:
            self.health.track(first)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="toolproxy-stackwatch")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._probing.values()) if t is not None and not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def detected_stack(self) -> str | None:
        """The stack fingerprinting found (a name the conditions know), or None yet."""
        return self._stack

    def report(self) -> dict | None:
        fp = self.fingerprints.get(None)
        if fp is None:
            return None
        return {
            "stack": fp.stack,
            "version": fp.version,
            "build": fp.build,
            "models": sorted(m for m in self.fingerprints if m is not None),
            "models_not_probed": self.not_probed,
        }

    def request(self, flow: Flow) -> None:
        """A path comparison and an append, nothing more (a spilled body, too large to hold, is skipped)."""
        if self._unreached:
            self._wake.set()  # traffic: is the upstream there now?
        rec = flow.rec
        if rec.method != "POST" or not rec.path.endswith(ATTEMPT_PATHS):
            return
        # The model the stack is asked for: the body as sent when the model was swapped (modelswap).
        sent = rec.upstream_request
        if sent is not None and sent.get("body_encoding") == "utf8":
            self._pending.append(sent["body"])
        elif rec.request_body_encoding == "utf8":
            self._pending.append(rec.request_body)
        else:
            return
        self._wake.set()

    async def fingerprint(self, model: str | None) -> Fingerprint:
        """The fingerprint for this model (None: the server alone), probing and recording it once."""
        if model in self.fingerprints:
            return self.fingerprints[model]
        return await asyncio.shield(self._start_probe(model))

    def _start_probe(self, model: str | None) -> asyncio.Task:
        """The probe of this model: the one already running, else a new one."""
        task = self._probing.get(model)
        if task is None:
            task = self._probing[model] = asyncio.get_running_loop().create_task(self._probe(model))
        return task

    async def _probe(self, model: str | None) -> Fingerprint:
        cfg = self.config
        started = time.time()
        headers = {"Authorization": f"Bearer {cfg.upstream_key}"} if cfg.upstream_key else {}
        try:
            fp = await probe(self.session(), cfg.upstream, model, headers=headers, timeout=cfg.connect_timeout)
        except Exception as exc:  # a bug here must cost a fingerprint, never the proxy
            fp = Fingerprint(upstream=cfg.upstream, stack="unknown", model=model, error=f"{type(exc).__name__}: {exc}")
        self.fingerprints[model] = fp
        self._probing.pop(model, None)
        self._unreached = fp.stack == UNREACHABLE
        if self.health is not None:
            self.health.observe(fp.stack != "unreachable", fp.error, "fingerprint")
        self.writer.submit(fingerprint_record(fp, cfg.default_run(started), started))
        if self._stack is None and fp.stack in STACKS:
            self._stack = fp.stack
        return fp

    def _reached(self) -> set[str | None]:
        """The names whose fingerprint found the upstream answering (an unreachable one is asked again)."""
        return {name for name, fp in self.fingerprints.items() if fp.stack != UNREACHABLE}

    def _new_model(self, body: str) -> str | None:
        if not model_candidates(body) - self._reached() - self._probing.keys():
            return None
        name = top_level_model(body)
        return name if name is not None and name not in self._reached() else None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        await self.fingerprint(None)
        next_probe = loop.time()
        while True:
            await self._wake.wait()
            self._wake.clear()
            server = self.fingerprints.get(None)
            if server is not None and server.stack == UNREACHABLE and loop.time() >= next_probe:
                next_probe = loop.time() + PROBE_GAP
                await self._start_probe(None)  # the stats say "unreachable" until it answers
            scanned = 0
            while self._pending:
                body = self._pending.popleft()
                scanned += len(body)
                name = self._new_model(body)
                if name is not None:
                    if len(self.fingerprints) > MAX_MODELS:
                        self.not_probed += 1
                    else:
                        await asyncio.sleep(max(0.0, next_probe - loop.time()))
                        next_probe = loop.time() + PROBE_GAP
                        await self._start_probe(name)  # new, or found unreachable before: ask
                if scanned >= SCAN_BATCH_CHARS:
                    scanned = 0
                    await asyncio.sleep(0)  # let requests run between batches of bodies
