"""An MCP server built with the mcp Python SDK (MCPServer), with the tools the MCP tests need:

    python tests/mcpserver.py                      stdio
    python tests/mcpserver.py http PORT [stateless] [json]   Streamable HTTP on 127.0.0.1:PORT (/mcp)
    python tests/mcpserver.py sse PORT             the older HTTP+SSE transport (/sse, /messages/)

add (a result), fail (an isError result), slow (answers after a delay), hang (never answers),
crash (writes to stderr, then the process exits with status 3), noise (a line on stdout that is no
JSON-RPC message, then a result), secret (returns $DEMO_TOKEN), progress (two progress
notifications, then a result).
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("toolproxy-test")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@app.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


@app.tool()
def slow(seconds: float) -> str:
    """Answers after a delay."""
    time.sleep(seconds)
    return "done"


@app.tool()
def hang() -> str:
    """Never answers."""
    while True:
        time.sleep(3600)


@app.tool()
def crash() -> str:
    """The server dies mid-call."""
    sys.stderr.write("fatal: the tool server crashed on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@app.tool()
def noise() -> str:
    """Writes a line that is no JSON-RPC message to stdout, then answers."""
    os.write(1, b"this is not json\n")
    return "noisy"


@app.tool()
def secret() -> str:
    """Returns the token the server was given in its environment."""
    sys.stderr.write(f"using token {os.environ.get('DEMO_TOKEN', '')}\n")
    sys.stderr.flush()
    return os.environ.get("DEMO_TOKEN", "")


@app.tool()
async def progress(ctx: Context) -> str:
    """Reports progress twice, then answers."""
    await ctx.report_progress(1, 2)
    await ctx.report_progress(2, 2)
    return "finished"


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "http":
        app.run(
            "streamable-http",
            host="127.0.0.1",
            port=int(sys.argv[2]),
            stateless_http="stateless" in sys.argv[3:],
            json_response="json" in sys.argv[3:],
        )
    elif mode == "sse":
        app.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
