"""A fastmcp server for the MCP tests (stdio): add, fail (an isError result)."""

from __future__ import annotations

from fastmcp import FastMCP

app = FastMCP("toolproxy-fastmcp")


@app.tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@app.tool
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


if __name__ == "__main__":
    app.run(show_banner=False)
