"""A small OTLP/HTTP trace receiver for tests: aiohttp on 127.0.0.1, decoding the real protobuf
`ExportTraceServiceRequest` every exporter sends (opentelemetry-proto's own message classes), and
keeping each span as the JSON the OTLP spec maps it to. `delay` makes it a slow receiver.
Also the tagged chat request the OTLP checks send through the proxy.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

from aiohttp import web
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Receiver:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.spans: list[dict] = []  # each span with "resource" and "scope" attributes folded in
        self.requests = 0
        self.url: str | None = None
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="otlp-receiver", daemon=True)

    async def _traces(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415, text=f"not protobuf: {request.content_type}")
        body = await request.read()
        if self.delay:
            await asyncio.sleep(self.delay)
        message = ExportTraceServiceRequest.FromString(body)
        self.requests += 1
        for rs in MessageToDict(message).get("resourceSpans", []):
            resource = {a["key"]: a["value"] for a in rs.get("resource", {}).get("attributes", [])}
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    self.spans.append({**span, "resource": resource, "scope": ss.get("scope", {})})
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def __enter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._runner.setup(), self._loop).result(10)
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        asyncio.run_coroutine_threadsafe(site.start(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def wait_for(self, n: int, timeout: float = 20.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.spans) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.spans)


def attributes(span: dict) -> dict:
    """A received span's attributes as plain values (OTLP JSON wraps each in a typed value)."""
    return {a["key"]: plain(a["value"]) for a in span.get("attributes", [])}


def plain(value: dict):
    if "arrayValue" in value:
        return [plain(v) for v in value["arrayValue"].get("values", [])]
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    return value


def send_chat(url: str, prompt: str, *, run: str, episode: str, model: str, tools: list, secret: str, **extra) -> int:
    """One chat request through the proxy under run/episode path tags, with an API key; its status."""
    req = urllib.request.Request(
        f"{url}/t/run={run}/episode={episode}/v1/chat/completions",
        data=json.dumps(
            {"model": model, "tools": tools, "messages": [{"role": "user", "content": prompt}], **extra}
        ).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {secret}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
