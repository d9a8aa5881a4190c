"""`toolproxy mcp --upstream URL`: an MCP server's Streamable HTTP (or older HTTP+SSE) traffic,
proxied and recorded as serve records a model's, each exchange an MCP record of that server.

Everything else is serve's: the listener, admission, limits, redaction, masking, budgets, the
crash bound, streams passed on as they come. What this adds is only what the transport says
outside the bodies: the server's name and the session. No body is parsed on the way (the
analyzer reads the JSON-RPC messages afterwards). A session id is a bearer of the session
(the specification warns of hijacking), so it is recorded by its keyed stand-in, as any secret
header is: the same session keeps the same stand-in, which is all the analyzer needs. The old
transport names it once more, in the `endpoint` event that opens its GET stream: that event's
query is redacted as a request's query is when the record is written (off the request path),
so the stream's record and the POSTs' name the session by the same stand-in.
"""

from __future__ import annotations

import dataclasses
import re
from urllib.parse import parse_qsl

from toolproxy.proxy.flow import Addon, Flow
from toolproxy.proxy.headers import Redactor
from toolproxy.record.model import Record

SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
# The old HTTP+SSE transport names the session in the query of each POST (the TypeScript SDK's
# `sessionId`, the Python SDK's `session_id`).
SESSION_PARAMS = ("sessionId", "session_id")
HTTP = "http"
# The old transport's first event: the URL to POST to, the session in its query.
_ENDPOINT = re.compile(r"(?m)^(event: ?endpoint\r?\ndata: ?[^?\s]*\?)(\S+)")


class McpTraffic(Addon):
    """Marks each exchange as the named MCP server's, with its session when one is known."""

    def __init__(self, server: str, redactor: Redactor) -> None:
        self.server = server
        self.redactor = redactor

    def request_headers(self, flow: Flow) -> None:
        mcp = {"transport": HTTP, "server": self.server, "session": None}
        for k, v in flow.request.headers.items():
            lk = k.lower()
            if lk == SESSION_HEADER:
                mcp["session"] = self.redactor.value(v)
            elif lk == VERSION_HEADER:
                mcp["protocol_version"] = v
        if mcp["session"] is None and flow.up_query:
            for k, v in parse_qsl(flow.up_query):
                if k in SESSION_PARAMS:
                    mcp["session"] = self.redactor.value(v)
                    break
        flow.rec.mcp = mcp

    def response_headers(self, flow: Flow, resp) -> None:
        mcp = flow.rec.mcp
        if mcp.get("session") is None:  # an initialize: the server names the session in its answer
            for k, v in flow.upstream_headers or ():
                if k.lower() == SESSION_HEADER:
                    mcp["session"] = self.redactor.value(v)
                    break

    def scrubbed(self, rec: Record) -> Record:
        """The record with the session in an `endpoint` event's query replaced by its stand-in
        (module doc); on the writer's thread. A body spilled to disk is left as it is."""
        body = rec.response_body
        if not isinstance(body, str) or rec.response_body_encoding == "base64" or "endpoint" not in body:
            return rec
        clean = _ENDPOINT.sub(lambda m: m.group(1) + self.redactor.query(m.group(2)), body)
        return dataclasses.replace(rec, response_body=clean) if clean != body else rec
