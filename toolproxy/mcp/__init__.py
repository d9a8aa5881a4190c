"""MCP servers' traffic: the stdio relay and its records, the `mcp` command, stdio playback."""
