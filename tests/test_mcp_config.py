"""An agent's MCP configuration rewritten for a run (toolproxy.drive.mcpconfig), per agent's shape."""

from __future__ import annotations

import datetime
import json
import stat
import tomllib
from pathlib import Path

import pytest

from toolproxy.drive import mcpconfig
from toolproxy.drive.mcpconfig import HTTP, SSE, STDIO, Server

CLAUDE = {
    "mcpServers": {
        "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "env": {"K": "v"}},
        "docs": {"type": "http", "url": "https://docs.example/mcp", "headers": {"Authorization": "Bearer x"}},
        "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
    },
    "other": True,
}
GEMINI = {"mcpServers": {"web": {"httpUrl": "http://127.0.0.1:9/mcp"}}, "security": {"auth": {"selectedType": "x"}}}
VSCODE = {"servers": {"git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"]}}}
OPENCODE = {"mcp": {"fs": {"type": "local", "command": ["npx", "-y", "pkg"], "environment": {}}}, "model": "a/b"}
CODEX = {
    "model": "m",
    "mcp_servers": {"fs": {"command": "npx", "args": ["pkg"], "env": {"A": "1"}}, "web": {"url": "http://h/mcp"}},
    "model_providers": {"tp": {"base_url": "http://x/v1", "wire_api": "responses"}},
    "profiles": [{"name": "a", "effort": 2.5, "on": True, "day": datetime.date(2026, 1, 2)}],
}

# (case, document, the servers it names)
CASES = [
    (
        "claude",
        CLAUDE,
        [
            Server("fs", STDIO, ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp"]),
            Server("docs", HTTP, url="https://docs.example/mcp"),
            Server("old", SSE, url="http://127.0.0.1:9/sse"),
        ],
    ),
    ("gemini", GEMINI, [Server("web", HTTP, url="http://127.0.0.1:9/mcp")]),
    ("vscode", VSCODE, [Server("git", STDIO, ["uvx", "mcp-server-git"])]),
    ("opencode", OPENCODE, [Server("fs", STDIO, ["npx", "-y", "pkg"])]),
    ("codex", CODEX, [Server("fs", STDIO, ["npx", "pkg"]), Server("web", HTTP, url="http://h/mcp")]),
]


@pytest.mark.parametrize("case,doc,expected", CASES, ids=[c[0] for c in CASES])
def test_the_servers_a_configuration_names(case, doc, expected):
    assert [s for _, s in mcpconfig.servers(doc)] == expected


@pytest.mark.parametrize("case,doc,expected", CASES, ids=[c[0] for c in CASES])
def test_every_server_wrapped_every_other_key_kept(case, doc, expected):
    out = mcpconfig.rewritten(doc, lambda s: ["wrap", s.name, "--", *s.command], lambda s: f"http://proxy/{s.name}")
    found = [s for _, s in mcpconfig.servers(out)]
    assert [s.name for s in found] == [s.name for s in expected]
    for before, after in zip(expected, found):
        if before.transport == STDIO:
            assert after.command == ["wrap", before.name, "--", *before.command]
        else:
            assert after.url == f"http://proxy/{before.name}" and after.transport == before.transport
    assert {k for k in out if k not in mcpconfig.CONTAINERS} == {k for k in doc if k not in mcpconfig.CONTAINERS}
    if case == "claude":
        assert out["mcpServers"]["fs"]["env"] == {"K": "v"} and out["mcpServers"]["docs"]["headers"]
    if case == "opencode":
        assert isinstance(out["mcp"]["fs"]["command"], list)


def test_toml_written_back_reads_the_same():
    text = mcpconfig.to_toml(CODEX)
    again = tomllib.loads(text)
    assert again == CODEX


def test_the_copy_replaces_the_file_on_the_command_line(tmp_path):
    config = tmp_path / ".mcp.json"
    config.write_text(json.dumps(CLAUDE))
    copy = tmp_path / "copy.json"
    argv = ["claude", "-p", "x", "--mcp-config", str(config), f"--settings={config}", "config.json"]
    assert mcpconfig.replace_path(argv, config, copy)
    assert argv == ["claude", "-p", "x", "--mcp-config", str(copy), f"--settings={copy}", "config.json"]
    assert not mcpconfig.replace_path(["claude"], config, copy)


def test_a_file_that_is_no_configuration_is_said(tmp_path):
    bad = tmp_path / "mcp.json"
    bad.write_text("{not json")
    with pytest.raises(mcpconfig.McpConfigError, match="is not valid JSON"):
        mcpconfig.read(bad)
    with pytest.raises(mcpconfig.McpConfigError, match="cannot read"):
        mcpconfig.read(Path(tmp_path / "missing.json"))


def test_a_remote_url_through_its_proxy_keeps_its_path_and_query():
    server = Server("docs", HTTP, url="https://docs.example/api/mcp?team=a")
    got = mcpconfig.proxied_url(server, "http://127.0.0.1:5", "r1", {"episode": "3"})
    assert got == "http://127.0.0.1:5/t/run=r1/episode=3/api/mcp?team=a"
    assert mcpconfig.origin(server.url) == "https://docs.example"


def test_the_copy_is_for_its_owner_alone(tmp_path):
    copy = tmp_path / "mcp-config" / "r1" / ".mcp.json"
    copy.parent.mkdir(parents=True)
    copy.write_text("{}")
    copy.chmod(0o644)  # left by an earlier run of the same name
    mcpconfig.write({"mcpServers": {"gh": {"command": "gh-mcp", "env": {"GITHUB_TOKEN": "ghp_x"}}}}, "json", copy)
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert json.loads(copy.read_text())["mcpServers"]["gh"]["env"] == {"GITHUB_TOKEN": "ghp_x"}
