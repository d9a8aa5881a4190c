"""The emulator's server: one aiohttp app per emulated stack, its scripted model, faults and what it saw.

Run one from a test with `async with FakeStack("ollama").running() as url` (or `.in_thread()` for
sync clients), or from a shell: `python -m toolproxy.emulators ollama --port 0`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip as gzip_mod
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

# Each stack's module registers its emulator in EMULATORS as it is imported.
import toolproxy.emulators.llamacpp  # noqa: F401
import toolproxy.emulators.llamacpp_python  # noqa: F401
import toolproxy.emulators.lmstudio  # noqa: F401
import toolproxy.emulators.ollama  # noqa: F401
import toolproxy.emulators.openai  # noqa: F401
import toolproxy.emulators.sglang  # noqa: F401
import toolproxy.emulators.vllm  # noqa: F401
from toolproxy import wire
from toolproxy.emulators.base import EMULATORS, Answer, Emulator
from toolproxy.emulators.faults import Fault
from toolproxy.emulators.model import DEFAULT_REPLY, ModelRequest, ScriptedReply
from toolproxy.stacks import catalog
from toolproxy.stacks.fingerprint import USER_AGENT_PREFIX

# llama-server's keep-alive: an SSE comment line with nothing after the colon (server: ping silent
# SSE streams, ggml-org/llama.cpp#24013)
KEEPALIVE = b":\n\n"

# The fault of the request being answered (each request is its own task), for faults that change
# what the model's reply becomes rather than how it travels.
_ANSWERING: ContextVar[Fault | None] = ContextVar("answering", default=None)


@dataclass
class Seen:
    """One request as the fake received it, and how its answer ended."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    header_list: list[tuple[str, str]]
    body: bytes
    outcome: str = "pending"  # complete | disconnected | cut (a close_mid_stream fault)
    raw_path: str = ""  # the request target as received (percent-encoding intact)
    status: int | None = None
    sent: bytes = b""  # the response body bytes written so far, as on the wire (after gzip)

    def json(self) -> Any:
        return orjson.loads(self.body)


class FakeStack:
    """One emulated stack. Options mirror the real launch flags:

    tool_parser: vLLM/SGLang `--tool-call-parser` (None: vLLM refuses auto tools, SGLang leaves calls
    in content); jinja: llama.cpp `--jinja` (default on; False gives the no_jinja variant);
    models: {name: capabilities} (Ollama refuses tools for models without "tools", LM Studio uses
    it for trained_for_tool_use); call_format: how unparsed calls look in content; cached_tokens:
    the cache report; loading: llama.cpp /health answers 503; prefix: the API is mounted under this
    path, as hosted ones are (https://openrouter.ai/api/v1/..., https://api.groq.com/openai/v1/...),
    and anything outside it is a 404.
    """

    def __init__(
        self,
        stack: str,
        *,
        models: dict[str, tuple[str, ...]] | None = None,
        tool_parser: str | None = None,
        jinja: bool = True,
        call_format: str | None = None,
        cached_tokens: int | None = None,
        context_length: int = 32768,
        replies: list[ScriptedReply] | None = None,
        responder: Callable[[ModelRequest], ScriptedReply | None] | None = None,
        prefix: str = "",
    ) -> None:
        if stack == "no_jinja":
            stack, jinja = "llamacpp", False
        if stack not in EMULATORS:
            raise ValueError(f"unknown stack {stack!r}; choose one of {', '.join(catalog.STACKS)} (or no_jinja)")
        self.kind = stack
        self.model_caps = dict(models if models is not None else catalog.BY_NAME[stack].models)
        self.models = list(self.model_caps)
        self.model = self.models[0]
        self.tool_parser = tool_parser
        self.jinja = jinja
        self.call_format = call_format
        self.cached_tokens = cached_tokens
        self.context_length = context_length
        self.loading = False
        self.created = int(time.time())
        self.replies: deque[ScriptedReply] = deque(replies or ())
        self.responder = responder
        self.prefix = prefix.rstrip("/")
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self.probes: list[Seen] = []
        self.disconnected = threading.Event()
        self.stack = EMULATORS[stack](self)
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    # -- scripting
    def enqueue(self, *replies: ScriptedReply) -> FakeStack:
        self.replies.extend(replies)
        return self

    def inject(self, *faults: Fault) -> FakeStack:
        self.faults.extend(faults)
        return self

    def fail(
        self,
        times: int = 1,
        status: int = 500,
        message: str = "llama runner process has terminated: exit status 2",
        path: str | None = None,
    ) -> FakeStack:
        """Answer `times` requests with this stack's own error body, then behave again."""
        answer = self.stack.error(status, message)
        return self.inject(
            Fault(times=times, path=path, status=status, body=answer.events[0], content_type=answer.content_type)
        )

    def capabilities_of(self, model: str) -> tuple[str, ...]:
        return tuple(self.model_caps.get(model, ()))

    def model_request(self, stack: Emulator, path: str, body: dict) -> ModelRequest:
        tools = [t.get("function", t).get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)]
        return ModelRequest(
            stack=stack.name,
            path=path,
            model=str(body.get("model") or self.model),
            body=body,
            messages=list(body.get("messages") or []),
            tools=tools,
            stream=bool(body.get("stream")),
            prompt=body.get("prompt"),
            constraint=stack.constraint(body),
            stops=wire.stop_strings(body),
        )

    def next_reply(self, req: ModelRequest) -> ScriptedReply:
        reply = self._scripted(req)
        fault = _ANSWERING.get()
        if fault is not None and fault.drop_streamed_calls and req.stream and reply.calls:
            return replace(reply, calls=())
        return reply

    def _scripted(self, req: ModelRequest) -> ScriptedReply:
        if self.replies:
            return self.replies.popleft()
        if self.responder is not None:
            reply = self.responder(req)
            if reply is not None:
                return reply
        return DEFAULT_REPLY

    # -- serving
    def _take_fault(self, path: str, method: str = "POST") -> Fault | None:
        for f in self.faults:
            if (
                (f.path is None or path.startswith(f.path))
                and (f.method is None or f.method == method)
                and (f.times is None or f.times > 0)
            ):
                if f.times is not None:
                    f.times -= 1
                return f
        return None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        table = {(m, p): h for m, p, h in self.stack.routes()}

        sockets = self.stack.websocket_routes()

        async def dispatch(request: web.Request) -> web.StreamResponse:
            path = request.path[len(self.prefix) :] if self.prefix else request.path
            if request.headers.get("Upgrade", "").lower() == "websocket" and path in sockets:
                return await sockets[path](request, self._socket_seen(request))
            body = await request.read()
            seen = Seen(
                request.method,
                request.path,
                request.query_string,
                dict(request.headers),
                list(request.headers.items()),
                body,
                raw_path=request.raw_path,
            )
            # toolproxy's fingerprint probes are filed apart and never take a scripted fault, so
            # `seen` and `inject` stay about the traffic under test.
            is_probe = request.headers.get("User-Agent", "").startswith(USER_AGENT_PREFIX)
            (self.probes if is_probe else self.seen).append(seen)
            try:
                return await self._answer(request, seen, table, faults=not is_probe)
            except (asyncio.CancelledError, ConnectionResetError):
                if seen.outcome == "pending":  # not our own close_mid_stream cut
                    seen.outcome = "disconnected"
                    self.disconnected.set()
                raise

        app.router.add_route("*", "/{tail:.*}", dispatch)
        return app

    def _socket_seen(self, request: web.Request):
        """Each message a WebSocket client sends, filed in `seen` like a request (method `WS`)."""

        def file(message: bytes) -> None:
            headers = list(request.headers.items())
            self.seen.append(
                Seen("WS", request.path, request.query_string, dict(headers), headers, message, "complete")
            )

        return file

    async def _answer(self, request: web.Request, seen: Seen, table, faults: bool = True) -> web.StreamResponse:
        fault = (self._take_fault(request.path, request.method) if faults else None) or Fault(times=0)
        _ANSWERING.set(fault)
        if fault.stall_before:
            await asyncio.sleep(fault.stall_before)
        if fault.status is not None:
            answer = Answer(fault.status, fault.content_type, [fault.body or b""])
        else:
            answer = await self._route(request, seen.body, table)
        headers = CIMultiDict(answer.headers)
        headers.extend(fault.headers)
        if answer.content_type:
            headers["Content-Type"] = answer.content_type
        if self.stack.profile.server_header:
            headers["Server"] = self.stack.profile.server_header
        payload = answer.events
        if fault.gzip:
            headers["Content-Encoding"] = "gzip"
            if answer.stream:
                comp = zlib.compressobj(wbits=31)
                payload = [comp.compress(e) + comp.flush(zlib.Z_SYNC_FLUSH) for e in payload] + [comp.flush()]
            else:
                payload = [gzip_mod.compress(b"".join(payload))]
        seen.status = answer.status
        if not answer.stream:
            whole = b"".join(payload)
            if fault.close_after is None:
                seen.sent, seen.outcome = whole, "complete"
                return web.Response(status=answer.status, body=whole, headers=headers)
            headers["Content-Length"] = str(len(whole))
            resp = web.StreamResponse(status=answer.status, headers=headers)
            await resp.prepare(request)
            seen.sent = whole[: fault.close_after]
            await resp.write(seen.sent)
            return self._cut(request, seen, resp)
        resp = web.StreamResponse(status=answer.status, headers=headers)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if fault.pings:
            until = time.monotonic() + fault.pings
            while time.monotonic() < until:
                seen.sent += KEEPALIVE
                await resp.write(KEEPALIVE)
                await asyncio.sleep(min(fault.ping_every, max(0.0, until - time.monotonic())))
        for i, event in enumerate(payload):
            if fault.close_after is not None and i >= fault.close_after:
                return self._cut(request, seen, resp)
            if fault.stall_between and i:
                await asyncio.sleep(fault.stall_between)
            seen.sent += event
            await resp.write(event)
        await resp.write_eof()
        seen.outcome = "complete"
        return resp

    def _cut(self, request: web.Request, seen: Seen, resp: web.StreamResponse) -> web.StreamResponse:
        seen.outcome = "cut"
        request.transport.close()  # flushes what was written, then FIN without the terminating chunk
        raise asyncio.CancelledError  # aiohttp drops a cancelled handler without writing anything more

    async def _route(self, request: web.Request, body: bytes, table) -> Answer:
        path = request.path
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                return self.stack.not_found()
            path = path[len(self.prefix) :]
        handler = table.get((request.method, path))
        if handler is None:
            if any(p == path for _, p in table):
                return self.stack.error(405, "Method Not Allowed")
            return self.stack.not_found()
        parsed: dict = {}
        if request.method == "POST":
            try:
                parsed = orjson.loads(body) if body else {}
            except orjson.JSONDecodeError as exc:
                return self.stack.error(400, f"invalid JSON body: {exc}")
            if not isinstance(parsed, dict):
                return self.stack.error(400, "request body must be a JSON object")
        return await handler(request, parsed)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @contextlib.asynccontextmanager
    async def running(self, host: str = "127.0.0.1", port: int = 0):
        """`async with fake.running() as url:` serve on the caller's event loop."""
        url = await self.start(host, port)
        try:
            yield url
        finally:
            await self.stop()

    @contextlib.contextmanager
    def in_thread(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """`with fake.in_thread() as url:` serve from a private loop, for sync clients and fixtures."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start(host, port))
            except BaseException as exc:  # reported to the caller below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=main, name=f"fake-{self.kind}", daemon=True)
        thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        try:
            yield self.url
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


@contextlib.asynccontextmanager
async def run_fake(stack: str, **options):
    """`async with run_fake("vllm", tool_parser="hermes") as fake:` -> the started FakeStack (fake.url)."""
    fake = FakeStack(stack, **options)
    async with fake.running():
        yield fake
