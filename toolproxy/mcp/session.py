"""The messages of one stdio MCP session -> its records: each request with its response, each
lone message on its own, and what never got an answer said so.

Both directions carry requests (the client's `tools/call`, the server's `sampling/createMessage`
or `ping`), so a request waits for its response among the other side's messages, by id. A
request that never gets one is still recorded, with the reason: the client cancelled it
(`notifications/cancelled`, its record written then, not at the end), the server exited with it
open, the client hung up on it, or the wrapper was stopped. A response to no open request (late,
after a cancel; or to an id never seen) and a line that is no JSON-RPC message are recorded on
their own. Nothing here parses on the relay's behalf: the relay has passed the bytes on before
they reach `message`.

Called from the relay's two pump threads: the open requests are behind a lock, and records go to
`submit` (the segment writer's, which never blocks) outside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolproxy.record.model import McpRecord, encode_body, new_id, now
from toolproxy.wire import jsonrpc

CLIENT, SERVER = "client", "server"
STDIO = "stdio"
MESSAGE, START, EXIT = "message", "start", "exit"
# Why a request has no response (the record's error_kind).
CANCELLED = "cancelled"
SERVER_EXITED = "server_exited"
CLIENT_CLOSED = "client_closed"
STOPPED = "stopped"
# A message past the size limit: relayed whole, recorded as its size.
TOO_LARGE = "message_too_large"
# An exit record's error_kind when the server ended while its client was still connected.
SERVER_CRASHED = "server_crashed"
SPAWN_FAILED = "spawn_failed"


def other(side: str) -> str:
    return SERVER if side == CLIENT else CLIENT


@dataclass(slots=True)
class Line:
    """One message as the relay read it: its bytes (None past the size limit), its size, and
    when its first and last byte came (wall clock, and perf_counter for durations)."""

    raw: bytes | None
    size: int
    wall: float
    first: float
    last: float


@dataclass(slots=True)
class _Open:
    line: Line
    msg: jsonrpc.Message
    sender: str


@dataclass
class SessionCounts:
    """What a session saw, for its exit record."""

    messages: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    unanswered: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"messages": dict(self.messages), "by_kind": dict(self.by_kind), "unanswered": self.unanswered}


class StdioSession:
    """Records for one server process's messages (see the module doc)."""

    def __init__(
        self,
        submit: Callable[[McpRecord], Any],
        *,
        server: str,
        run: str | None = None,
        episode: str | None = None,
        item: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        self.submit = submit
        self.server = server
        self.session = new_id()
        self.run, self.episode, self.item = run, episode, item
        self.tags = dict(tags or {})
        self.counts = SessionCounts()
        self._open: dict[tuple[str, str], _Open] = {}
        self._lock = threading.Lock()

    # ---- the record's common parts --------------------------------------------------------

    def _record(self, started_at: float, mcp: dict[str, Any], **fields: Any) -> McpRecord:
        return McpRecord(
            id=new_id(),
            started_at=started_at,
            run=self.run,
            episode=self.episode,
            item=self.item,
            tags=dict(self.tags),
            upstream=f"{STDIO}:{self.server}",
            mcp={"transport": STDIO, "server": self.server, "session": self.session, **mcp},
            **fields,
        )

    @staticmethod
    def _body(line: Line, which: str) -> dict[str, Any]:
        text, encoding = encode_body(line.raw)
        out = {f"{which}_body": text, f"{which}_body_encoding": encoding}
        if which == "request":
            out["request_body_size"] = line.size
        return out

    # ---- what the relay calls -------------------------------------------------------------

    def message(self, sender: str, line: Line) -> None:
        """A whole message from `sender`, already passed on."""
        msg = jsonrpc.read_message(line.raw) if line.raw is not None else jsonrpc.Message(TOO_LARGE)
        done: list[McpRecord] = []
        with self._lock:
            counts = self.counts
            counts.messages[sender] = counts.messages.get(sender, 0) + 1
            counts.by_kind[msg.kind] = counts.by_kind.get(msg.kind, 0) + 1
            if msg.kind == jsonrpc.REQUEST:
                key = (sender, msg.id_key)
                earlier = self._open.pop(key, None)
                if earlier is not None:  # the same id again before an answer: the first is left unanswered
                    done.append(self._unanswered(earlier, "reused", f"the {sender} sent another request with this id"))
                self._open[key] = _Open(line, msg, sender)
            elif msg.kind == jsonrpc.RESPONSE:
                asked = self._open.pop((other(sender), msg.id_key), None)
                done.append(self._pair(asked, line, msg) if asked is not None else self._lone(sender, line, msg))
            else:
                done.append(self._lone(sender, line, msg))
                cancelled = jsonrpc.cancelled_id(msg)
                if cancelled is not None:
                    asked = self._open.pop((sender, cancelled), None)
                    if asked is not None:
                        reason = msg.doc.get("params", {}).get("reason")
                        done.append(
                            self._unanswered(
                                asked,
                                CANCELLED,
                                f"the {sender} cancelled it" + (f": {reason}" if isinstance(reason, str) else ""),
                                line,
                            )
                        )
        for rec in done:
            self.submit(rec)

    def close(self, kind: str, message: str) -> None:
        """Every request still open recorded as unanswered, for `kind`."""
        with self._lock:
            opened, self._open = list(self._open.values()), {}
        for asked in opened:
            self.submit(self._unanswered(asked, kind, message))

    def start(self, command: list[str], pid: int | None, error: str | None = None) -> None:
        """The server process started (or could not be: `error`)."""
        wall = now()
        rec = self._record(wall, {"event": START, "command": command, "pid": pid}, ended_at=wall)
        if error is not None:
            rec.set_error(SPAWN_FAILED, error)
        self.submit(rec)

    def exit(self, returncode: int | None, stderr_tail: bytes, *, client_first: bool, message: str) -> None:
        """The server process ended: its status, the last of what it wrote to stderr (as the
        record's response body, so masking reads it as any body) and the session's counts."""
        wall = now()
        signal = -returncode if returncode is not None and returncode < 0 else None
        text, encoding = encode_body(stderr_tail or None)
        rec = self._record(
            wall,
            {
                "event": EXIT,
                "returncode": returncode,
                "signal": signal,
                "client_closed_first": client_first,
                **self.counts.as_dict(),
            },
            ended_at=wall,
            response_body=text,
            response_body_encoding=encoding,
            response_complete=True,
        )
        if not client_first:
            rec.set_error(SERVER_CRASHED, message)
        self.submit(rec)

    # ---- records ---------------------------------------------------------------------------

    def _mcp(self, sender: str, msg: jsonrpc.Message) -> dict[str, Any]:
        out: dict[str, Any] = {"event": MESSAGE, "from": sender, "message": msg.kind}
        if msg.method is not None:
            out["method"] = msg.method
        if msg.id_key is not None:
            out["id"] = msg.doc["id"]
        return out

    def _pair(self, asked: _Open, line: Line, msg: jsonrpc.Message) -> McpRecord:
        req = asked.line
        rec = self._record(
            req.wall,
            self._mcp(asked.sender, asked.msg),
            ended_at=line.wall,
            ttfb_ms=round((line.first - req.last) * 1000.0, 3),
            duration_ms=round((line.last - req.last) * 1000.0, 3),
            response_complete=True,
            **self._body(req, "request"),
            **self._body(line, "response"),
        )
        if msg.is_error:
            rec.mcp["error"] = True
        return rec

    def _lone(self, sender: str, line: Line, msg: jsonrpc.Message) -> McpRecord:
        rec = self._record(line.wall, self._mcp(sender, msg), ended_at=line.wall, **self._body(line, "request"))
        if msg.kind == jsonrpc.RESPONSE:
            rec.mcp["unmatched"] = True  # late (after a cancel), or to an id never asked
            if msg.is_error:
                rec.mcp["error"] = True
        elif msg.kind == TOO_LARGE:
            rec.set_error(TOO_LARGE, f"a message of {line.size} bytes, past the recording limit; relayed whole")
        return rec

    def _unanswered(self, asked: _Open, kind: str, message: str, at: Line | None = None) -> McpRecord:
        self.counts.unanswered += 1
        req = asked.line
        end_wall, end = (at.wall, at.last) if at is not None else (now(), time.perf_counter())
        rec = self._record(
            req.wall,
            self._mcp(asked.sender, asked.msg),
            ended_at=end_wall,
            duration_ms=round((end - req.last) * 1000.0, 3),
            **self._body(req, "request"),
        )
        rec.set_error(kind, message)
        return rec
