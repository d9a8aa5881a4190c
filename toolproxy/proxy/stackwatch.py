"""Fingerprint records while serving: once at start, then once per model name the traffic uses.

The hot path must not parse JSON, yet the model name is inside the request body. So the handler
does nothing new: `ProxyState.count`, which already runs once per finished exchange, calls its
listeners, and this one (`observe`) only compares the path and appends the body to a bounded
deque. A background task takes the bodies from there, off the request's path, and finds the
`"model"` values with `str.find` (a C scan, no parse). Only a body holding a name not yet seen
costs a real parse, to make sure `"model"` is the top-level key and not, say, a tool argument:
once per model, plus once per body whose nested `"model"` values are new. Probing and recording
happen in background tasks too, so serving never waits for them, and a slow or dead upstream
only delays a fingerprint record, never a response.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING

import orjson

from toolproxy.record.model import Record
from toolproxy.stacks.fingerprint import Fingerprint, fingerprint_record, probe
from toolproxy.stacks.names import STACKS

if TYPE_CHECKING:
    from toolproxy.proxy.app import ProxyState

ATTEMPT_PATHS = ("/chat/completions", "/completions", "/api/chat", "/api/generate", "/v1/messages", "/responses")
_KEY = '"model"'
_MAX_PENDING = 256


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
                    found.add(body[j + 1:end])
        i = body.find(_KEY, i + 1)
    return found


def top_level_model(body: str) -> str | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None


class StackWatch:
    def __init__(self, state: "ProxyState") -> None:
        self.state = state
        self.fingerprints: dict[str | None, Fingerprint] = {}
        self._probing: dict[str | None, asyncio.Task] = {}
        self._pending: collections.deque[str] = collections.deque(maxlen=_MAX_PENDING)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="toolproxy-stackwatch")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._probing.values()) if t is not None and not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def summary(self) -> dict | None:
        fp = self.fingerprints.get(None)
        if fp is None:
            return None
        return {"stack": fp.stack, "version": fp.version, "build": fp.build,
                "models": sorted(m for m in self.fingerprints if m is not None)}

    def observe(self, rec: Record) -> None:
        """Called for every finished exchange: a path comparison and an append, nothing more."""
        if rec.method == "POST" and rec.request_body and rec.request_body_encoding == "utf8" and rec.path.endswith(ATTEMPT_PATHS):
            self._pending.append(rec.request_body)
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
        cfg = self.state.config
        started = time.time()
        headers = {"Authorization": f"Bearer {cfg.upstream_key}"} if cfg.upstream_key else {}
        try:
            fp = await probe(self.state.session, cfg.upstream, model, headers=headers, timeout=cfg.connect_timeout)
        except Exception as exc:  # a bug here must cost a fingerprint, never the proxy
            fp = Fingerprint(upstream=cfg.upstream, stack="unknown", model=model, error=f"{type(exc).__name__}: {exc}")
        self.fingerprints[model] = fp
        self._probing.pop(model, None)
        self.state.writer.submit(fingerprint_record(fp, cfg.run, started))
        options = cfg.condition_options
        if options.stack is None and fp.stack in STACKS:
            # --stack was not given: the constrained and template conditions need the dialect.
            options.stack = fp.stack
        return fp

    async def _run(self) -> None:
        await self.fingerprint(None)
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                body = self._pending.popleft()
                if model_candidates(body) - self.fingerprints.keys() - self._probing.keys():
                    name = top_level_model(body)
                    if name is not None and name not in self.fingerprints:
                        self._start_probe(name)
                await asyncio.sleep(0)  # let requests run between bodies
