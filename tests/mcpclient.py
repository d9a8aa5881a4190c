"""An MCP client built with the mcp Python SDK, for the MCP tests:

    python tests/mcpclient.py MODE CALLS -- CMD ARGS     a stdio server started from CMD
    python tests/mcpclient.py MODE CALLS --url URL       a Streamable HTTP server
    python tests/mcpclient.py legacy CALLS --sse URL     a server of the older HTTP+SSE transport

MODE is the SDK's connect mode (legacy: the initialize handshake; auto: the 2026-07-28 revision's
server/discover). CALLS is a JSON list of [tool, arguments, timeout or null]. Prints one JSON line
per call: {"tool", "ok", "is_error", "text"} or {"tool", "exception"}; the client's own record of
what it executed, which the tests hold the recording to.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters


async def main() -> None:
    mode, calls = sys.argv[1], json.loads(sys.argv[2])
    if "--url" in sys.argv:
        server = sys.argv[sys.argv.index("--url") + 1]
    elif "--sse" in sys.argv:
        from mcp.client.sse import sse_client

        server = sse_client(sys.argv[sys.argv.index("--sse") + 1])
    else:
        argv = sys.argv[sys.argv.index("--") + 1 :]
        server = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
    async with Client(server, mode=mode) as client:
        tools = await client.list_tools()
        print(json.dumps({"tools": sorted(t.name for t in tools.tools)}), flush=True)
        for tool, arguments, timeout in calls:
            try:
                result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
            except Exception as exc:  # noqa: BLE001 - the client's own view of what happened is the point
                print(json.dumps({"tool": tool, "exception": f"{type(exc).__name__}: {exc}"}), flush=True)
                if "closed" in str(exc).lower() or "Connection" in type(exc).__name__:
                    return
                continue
            text = " ".join(getattr(c, "text", "") for c in result.content)
            print(json.dumps({"tool": tool, "ok": True, "is_error": result.is_error, "text": text}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
