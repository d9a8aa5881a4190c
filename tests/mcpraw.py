"""A stdio MCP server written by hand, for what the SDK's servers never do: `python tests/mcpraw.py`
writes a banner line that is no JSON-RPC message to stdout before it serves (as servers that log
to stdout do), and its tool `noise` writes another before its result. Tools: echo, noise."""

from __future__ import annotations

import json
import sys

TOOLS = [
    {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
    {"name": "noise", "inputSchema": {"type": "object", "properties": {}}},
]


def send(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def main() -> None:
    sys.stdout.write("raw server ready (a log line on stdout)\n")
    sys.stdout.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        method, rid = msg.get("method"), msg["id"]
        if method == "initialize":
            result = {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            name = msg["params"]["name"]
            if name == "noise":
                sys.stdout.write("debug: noise was called\n")
                sys.stdout.flush()
            text = msg["params"].get("arguments", {}).get("text", "noisy")
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": result})


if __name__ == "__main__":
    main()
