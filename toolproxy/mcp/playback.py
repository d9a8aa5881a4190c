"""`toolproxy mcp --playback RUN --name NAME`: a recorded stdio MCP server answering again.

The agent starts it where its configuration named the server (`run --playback` rewrites the
configuration so). Each request the agent sends is matched against the recorded requests of
that server in that run as playback matches a model's (`playback.match`: method, then the
request less its id and `params._meta`, each recorded exchange once, in order, per episode
where tags say so), and answered with the recorded response under the request's own id. A miss
is a JSON-RPC error naming the closest recorded request and the first difference (`fail`), or
the request goes to the real server, started then from the command after `--` (`forward`),
through a recording wrapper into the played run (`record`: the fixture grows itself). The real
server first gets the agent's handshake as the agent sent it (`initialize` and
`notifications/initialized`, for servers of revisions that have one); from then on what it
sends reaches the agent as it comes, and the agent's notifications and responses reach it.

Server-initiated messages of the recording (progress, logging, list changes, the server's own
requests) are not played: what is answered is what the agent asks.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import orjson

from toolproxy.mcp.relay import LineCutter, write_all
from toolproxy.mcp.session import Line
from toolproxy.playback.fixture import RecordedExchange
from toolproxy.playback.match import Matcher, MatchRules, Miss
from toolproxy.term.printable import printable
from toolproxy.wire import jsonrpc

# The JSON-RPC error code of a miss: -32000..-32099 are left to implementations.
MISS_CODE = -32000
HANDSHAKE = ("initialize", "notifications/initialized")


def miss_response(asked_id, message: str, closest: str | None) -> bytes:
    data = {"toolproxy": "playback_miss"}
    if closest is not None:
        data["closest"] = closest
    return (
        orjson.dumps({"jsonrpc": "2.0", "id": asked_id, "error": {"code": MISS_CODE, "message": message, "data": data}})
        + b"\n"
    )


class StdioPlayback:
    """Answers one agent's session from the recording (module doc); `run()` returns the exit status."""

    def __init__(
        self,
        exchanges: list[RecordedExchange],
        rules: MatchRules,
        *,
        server: str,
        episode: str | None,
        on_miss: str,
        real_server: list[str] | None,
        limit: int,
        client_in: int = 0,
        client_out: int = 1,
        errors: int = 2,
    ) -> None:
        self.matcher = Matcher(exchanges, rules)
        self.server = server
        self.episode = episode
        self.on_miss = on_miss
        self.real_server = real_server
        self.limit = limit
        self.client_in, self.client_out, self.errors = client_in, client_out, errors
        self.out_lock = threading.Lock()
        self.handshake: list[bytes] = []
        self.proc = None
        self.played = self.missed = self.relayed = 0
        self.unread = 0  # lines from the agent that were no request and reached no server
        self.start_error: str | None = None

    def _send(self, data: bytes) -> None:
        with self.out_lock:
            write_all(self.client_out, data)

    def _say(self, text: str) -> None:
        try:
            os.write(self.errors, (printable(f"toolproxy mcp: {text}") + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def run(self) -> int:
        lines = LineCutter(self.limit)
        try:
            while True:
                data = os.read(self.client_in, 64 * 1024)
                if not data:
                    break
                for line in lines.feed(data, time.perf_counter()):
                    self._message(line)
            last = lines.rest(time.perf_counter())
            if last is not None:
                self._message(last)
        except BrokenPipeError:
            pass  # the agent stopped reading
        finally:
            self._say(
                f"playback of {self.server}: {self.played} answered from the recording, {self.missed} misses"
                + (f" ({self.relayed} sent to the real server)" if self.relayed else "")
                + (f", {self.unread} lines not read" if self.unread else "")
            )
            self._stop_server()
        return 0

    def _message(self, line: Line) -> None:
        if line.raw is None:
            self.unread += 1
            self._say(f"a line of {line.size} bytes from the agent, past the size limit, was not read")
            return
        msg = jsonrpc.read_message(line.raw)
        if msg.method in HANDSHAKE:
            self.handshake.append(line.raw)
        if msg.kind != jsonrpc.REQUEST:
            if self.proc is not None:  # notifications and the agent's answers go to the real server
                self._to_server(line.raw)
            elif msg.kind not in (jsonrpc.NOTIFICATION, jsonrpc.RESPONSE):
                self.unread += 1
                self._say(f"a line from the agent that is no JSON-RPC request ({msg.kind}) was not answered")
            return
        found = self.matcher.take("MCP", msg.method, "", line.raw, self.episode, self.server)
        if not isinstance(found, Miss):
            self.played += 1
            recorded = jsonrpc.read_message(found.request_body)
            body = found.body
            if recorded.id_key is not None:
                body = jsonrpc.with_id(body, recorded.id_key, msg.doc["id"])
            self._send(body if body.endswith(b"\n") else body + b"\n")
            return
        self.missed += 1
        message = found.message().replace("--on-miss record", "--on-miss record -- SERVER COMMAND")
        if self.on_miss != "fail" and self.real_server and (self.proc is not None or self._start_server(line.raw)):
            self.relayed += 1
            self._to_server(line.raw)
            return
        if self.start_error is not None:
            message = f"{message}; the real server could not be started: {self.start_error}"
        self._say(message)
        closest = found.closest.id if found.closest is not None else None
        self._send(miss_response(msg.doc["id"], message, closest))

    def _start_server(self, missed: bytes) -> bool:
        """The real server, given the agent's handshake first (less `missed`, the request that
        starts it, which the caller sends): the agent got the recording's answers to it. False
        when it cannot be started (said once; every miss is then answered as an error)."""
        if self.start_error is not None:
            return False
        try:
            self.proc = subprocess.Popen(self.real_server, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            self.start_error = f"{printable(self.real_server[0])}: {exc.strerror or exc}"
            self._say(f"cannot start the real server {self.start_error}")
            return False
        earlier = [raw for raw in self.handshake if raw is not missed]
        handshake_ids = {msg.id_key for msg in map(jsonrpc.read_message, earlier) if msg.kind == jsonrpc.REQUEST}
        threading.Thread(target=self._from_server, args=(handshake_ids,), daemon=True).start()
        for raw in earlier:
            self._to_server(raw)
        return True

    def _from_server(self, skip: set[str]) -> None:
        lines = LineCutter(self.limit)
        src = self.proc.stdout.fileno()
        while True:
            try:
                data = os.read(src, 64 * 1024)
            except OSError:
                data = b""
            if not data:
                return
            for line in lines.feed(data, time.perf_counter()):
                if line.raw is None:
                    continue
                msg = jsonrpc.read_message(line.raw)
                if msg.kind == jsonrpc.RESPONSE and msg.id_key in skip:
                    skip.discard(msg.id_key)
                    continue
                try:
                    self._send(line.raw)
                except OSError:
                    return

    def _to_server(self, raw: bytes) -> None:
        try:
            write_all(self.proc.stdin.fileno(), raw)
        except OSError:
            self._say(f"the real server {printable(self.real_server[0])} is gone; a miss has no answer")

    def _stop_server(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(5)
        except Exception:  # noqa: BLE001 - stopping it is all that is left to do
            self.proc.kill()
