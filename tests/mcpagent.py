"""An openai-agents agent whose tools come from the MCP servers a Claude-style `mcp.json` names:
`python tests/mcpagent.py MCP.JSON TASK`. Prints the agent's own record of the run: the tool calls
it made and the outputs it got back (what it executed), and its final answer."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from agents.items import ToolCallItem, ToolCallOutputItem
from agents.mcp import MCPServerStdio, MCPServerStreamableHttp
from openai import AsyncOpenAI

set_tracing_disabled(True)


async def main():
    config = json.load(open(sys.argv[1]))["mcpServers"]
    servers = []
    for name, entry in config.items():
        if "command" in entry:
            servers.append(
                MCPServerStdio(
                    params={"command": entry["command"], "args": entry.get("args", []), "env": dict(os.environ)},
                    name=name,
                    client_session_timeout_seconds=30,
                )
            )
        else:
            servers.append(
                MCPServerStreamableHttp(params={"url": entry["url"]}, name=name, client_session_timeout_seconds=30)
            )
    for s in servers:
        await s.connect()
    try:
        agent = Agent(
            name="calc",
            instructions="Use the tools.",
            mcp_servers=servers,
            model=OpenAIChatCompletionsModel(model=os.environ.get("MODEL", "m"), openai_client=AsyncOpenAI()),
        )
        result = await Runner.run(agent, sys.argv[2], max_turns=6)
        calls = [i.raw_item.name for i in result.new_items if isinstance(i, ToolCallItem)]
        outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
        print(json.dumps({"called": calls, "outputs": outputs, "final": result.final_output}))
    finally:
        for s in reversed(servers):
            await s.cleanup()


asyncio.run(main())
