"""An agent's MCP configuration, rewritten for a run so that every server it names is wrapped.

Agents name their MCP servers in a file, each either a command (stdio) or a URL (Streamable
HTTP, or the older HTTP+SSE). For a run, a copy of that file is written (the user's own is never
edited) in which each command starts `toolproxy mcp ... -- COMMAND` instead, and each URL points
at a `toolproxy mcp` proxy of that server, so the servers' traffic is recorded beside the
model's, in the same run and with the same tags. Under `run --playback` the copy names the
recorded servers instead: a stdio one played by `toolproxy mcp --playback`, an HTTP one by the
playback server, each behind a recording wrapper of its own, so the agent's test runs offline,
model and tools, and is recorded as a run of its own.

The shapes read (each server's entry keeps every other key as it was: env, cwd, headers ...):

- `mcpServers: {NAME: {command, args} | {url} | {httpUrl} | {type, url}}`: Claude Code (`.mcp.json`,
  `--mcp-config`), Claude Desktop, Gemini CLI and Qwen Code (`settings.json`: `httpUrl` is
  Streamable HTTP, `url` HTTP+SSE), Cursor, Windsurf;
- `servers: {NAME: {type: stdio|http|sse, command, args, url}}`: VS Code's `mcp.json`;
- `mcp: {NAME: {type: local, command: [ARGV]} | {type: remote, url}}`: opencode;
- `[mcp_servers.NAME]` with `command`, `args` or `url`: Codex's `config.toml` (written back as
  TOML: every table and value it had, comments not kept).

A table of agents (which file each reads, which variable names it) can call `wrap_file` for the
file its agent reads; `toolproxy run --mcp-config PATH` does it for the file the command names.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolproxy.proxy.tags import tag_prefix

# Where the rewritten copies go, under the run's data folder (kept: they show what the agent was told).
MCP_DIR = "mcp-config"
# The variable that names the rewritten copy, for an agent told its config by a variable of the user's.
CONFIG_VAR = "TOOLPROXY_MCP_CONFIG"
STDIO, HTTP, SSE = "stdio", "http", "sse"


class McpConfigError(ValueError):
    """A file that cannot be read as an MCP configuration; the message says why."""


@dataclass(frozen=True)
class Server:
    """One server of a configuration: its name, transport, and command or URL."""

    name: str
    transport: str
    command: list[str] | None = None
    url: str | None = None


# Per container key: how an entry's transport, command and URL are read and written.
def _command(entry: dict) -> list[str] | None:
    command = entry.get("command")
    if isinstance(command, list):  # opencode: the whole argv
        return [str(c) for c in command] or None
    if isinstance(command, str) and command:
        args = entry.get("args") or []
        return [command, *(str(a) for a in args)] if isinstance(args, list) else None
    return None


def _transport(entry: dict) -> str | None:
    if _command(entry) is not None:
        return STDIO
    if entry.get("httpUrl"):
        return HTTP
    if entry.get("url"):  # either transport is proxied alike: the word is for what is printed
        kind = str(entry.get("type") or entry.get("transport") or "").lower()
        return SSE if kind == "sse" else HTTP
    return None


def _url_key(entry: dict) -> str:
    return "httpUrl" if entry.get("httpUrl") else "url"


CONTAINERS = ("mcpServers", "servers", "mcp", "mcp_servers")


def read(path: Path) -> tuple[dict, str]:
    """(the configuration, its format: json or toml)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise McpConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".toml":
            return tomllib.loads(text), "toml"
        doc = json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise McpConfigError(f"{path} is not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}") from None
    if not isinstance(doc, dict):
        raise McpConfigError(f"{path} holds no object of settings")
    return doc, "json"


def servers(doc: dict) -> list[tuple[str, Server]]:
    """(container key, server) for every server the configuration names."""
    out = []
    for key in CONTAINERS:
        table = doc.get(key)
        if not isinstance(table, dict):
            continue
        for name, entry in table.items():
            if not isinstance(entry, dict):
                continue
            transport = _transport(entry)
            if transport is None:
                continue
            command = _command(entry) if transport == STDIO else None
            url = str(entry.get(_url_key(entry))) if transport != STDIO else None
            out.append((key, Server(str(name), transport, command, url)))
    return out


def rewritten(
    doc: dict,
    stdio: Callable[[Server], list[str]],
    remote: Callable[[Server], str],
) -> dict:
    """A copy of `doc` with each stdio server's command replaced by `stdio(server)` (an argv) and
    each remote server's URL by `remote(server)`; every other key as it was."""
    out = json.loads(json.dumps(doc, default=_dated))
    for key, server in servers(doc):
        entry = out[key][server.name]
        if server.transport == STDIO:
            argv = stdio(server)
            if isinstance(entry.get("command"), list):
                entry["command"] = argv
            else:
                entry["command"], entry["args"] = argv[0], argv[1:]
        else:
            entry[_url_key(entry)] = remote(server)
    return out


def write(doc: dict, fmt: str, path: Path) -> None:
    """The copy, readable by its owner alone: it holds what the user's file holds (a server's
    `env` tokens, an Authorization header), which the agent needs and nobody else may read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2) + "\n" if fmt == "json" else to_toml(doc)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a copy left by an earlier run of the same name had the mode it had
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)


def wrapper_argv(data_dir: Path, run: str | None, tags: dict[str, str], name: str, *rest: str) -> list[str]:
    """`toolproxy mcp` as the agent starts it: this interpreter, this toolproxy, the run's data."""
    argv = [sys.executable, "-m", "toolproxy.cli", "mcp", "--data", str(Path(data_dir).resolve()), "--name", name]
    if run:
        argv += ["--run", run]
    argv += [f"--tag={k}={v}" for k, v in sorted(tags.items())]
    return [*argv, *rest]


def recording_stdio(data_dir: Path, run: str | None, tags: dict[str, str]) -> Callable[[Server], list[str]]:
    """Each stdio server started behind the recording wrapper."""
    return lambda server: wrapper_argv(data_dir, run, tags, server.name, "--", *server.command)


def playing_stdio(
    data_dir: Path, run: str | None, tags: dict[str, str], played: str, on_miss: str
) -> Callable[[Server], list[str]]:
    """Each stdio server played from run `played`, behind a recording wrapper of the new run;
    a miss sent to the real server (recorded into `played`) when `on_miss` says so."""

    def argv(server: Server) -> list[str]:
        player = wrapper_argv(data_dir, None, tags, server.name, "--playback", played, "--on-miss", on_miss)
        if on_miss != "fail":
            player += ["--", *server.command]
        return wrapper_argv(data_dir, run, tags, server.name, "--", *player)

    return argv


def proxied_url(server: Server, proxy_url: str, run: str | None, tags: dict[str, str]) -> str:
    """A remote server's URL through its `toolproxy mcp` proxy at `proxy_url`: the run's tags
    first, then the server's own path and query."""
    from yarl import URL

    url = URL(server.url)
    rest = url.raw_path + (f"?{url.raw_query_string}" if url.raw_query_string else "")
    return proxy_url + tag_prefix(run, **tags) + rest


def origin(url: str) -> str:
    """scheme://host[:port] of a URL: the upstream of its server's proxy."""
    from yarl import URL

    u = URL(url)
    return str(u.origin())


def _dated(value: Any) -> str:
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a configuration value")


def to_toml(doc: dict) -> str:
    """A configuration as TOML: its values first, then each table under its dotted name."""
    lines: list[str] = []
    _toml_table(doc, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_table(table: dict, path: list[str], lines: list[str]) -> None:
    subtables = []
    if path:
        lines.append("")
        lines.append(f"[{'.'.join(_toml_key(p) for p in path)}]")
    for key, value in table.items():
        if isinstance(value, dict):
            subtables.append((key, value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            subtables.append((key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in subtables:
        if isinstance(value, dict):
            _toml_table(value, [*path, key], lines)
        else:
            for item in value:
                lines.append("")
                lines.append(f"[[{'.'.join(_toml_key(p) for p in [*path, key])}]]")
                for k, v in item.items():
                    lines.append(f"{_toml_key(k)} = {_toml_value(v)}")


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "-_" for c in key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise McpConfigError(f"a value of type {type(value).__name__} cannot be written as TOML")


@dataclass
class Wrapped:
    """What a run's MCP configurations became: the agent's argv with each file named replaced by
    its rewritten copy, the variable naming the (last) copy, and the proxies started for remote
    servers. `stop` stops them and removes the copies: they hold the secrets of the user's file
    and are of no use once the agent has ended."""

    argv: list[str]
    env: dict[str, str]
    proxies: list
    lines: list[str]
    copies: list[Path] = field(default_factory=list)

    async def stop(self) -> None:
        for proxy in self.proxies:
            await proxy.stop()
        for copy in self.copies:
            copy.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the run's folder, once empty
                copy.parent.rmdir()


async def wrap_configs(
    paths: list[Path],
    argv: list[str],
    config,
    tags: dict[str, str],
    *,
    played: str | None = None,
    playback_url: str | None = None,
    on_miss: str = "fail",
) -> Wrapped:
    """Each configuration at `paths` rewritten for the run of `config` (module doc): remote
    servers get a `toolproxy mcp` proxy each, on this loop, recording with the run's settings
    (to the server's own upstream, or under `played` to the playback server at `playback_url`)."""
    import dataclasses

    from toolproxy.proxy.server import start_proxy

    wrapped = Wrapped(list(argv), {}, [], [])
    run = config.run
    stdio = (
        playing_stdio(config.data_dir, run, tags, played, on_miss)
        if played is not None
        else recording_stdio(config.data_dir, run, tags)
    )
    started: dict[tuple[str, str], str] = {}

    async def proxy_for(server: Server) -> str:
        upstream = playback_url + tag_prefix(mcp_server=server.name) if played is not None else origin(server.url)
        key = (server.name, upstream)
        if key not in started:
            mcp_config = dataclasses.replace(
                config,
                upstream=upstream,
                port=0,
                mcp_server=server.name,
                fingerprint=False,
                live_page=False,
                otlp_endpoint=None,
            )
            proxy = await start_proxy(mcp_config)
            wrapped.proxies.append(proxy)
            started[key] = proxy.url
        return started[key]

    names = [p.name for p in paths]
    try:
        for i, path in enumerate(paths):
            doc, fmt = read(path)
            found = servers(doc)
            urls = {s.name: proxied_url(s, await proxy_for(s), run, tags) for _, s in found if s.transport != STDIO}
            name = path.name if names.count(path.name) == 1 else f"{i}-{path.name}"
            copy = Path(config.data_dir) / MCP_DIR / (run or "run") / name
            wrapped.copies.append(copy)
            write(rewritten(doc, stdio, urls_of(urls)), fmt, copy)
            named = replace_path(wrapped.argv, path, copy)
            wrapped.env[CONFIG_VAR] = str(copy)
            listed = ", ".join(f"{s.name} ({s.transport})" for _, s in found) or "no servers"
            where = "on the command line" if named else f"(not on the command line: ${CONFIG_VAR} names the copy)"
            wrapped.lines.append(f"MCP servers of {path}: {listed}; wrapped in {copy} {where}")
    except BaseException:
        await wrapped.stop()
        raise
    return wrapped


def urls_of(urls: dict[str, str]) -> Callable[[Server], str]:
    """The new URL of each remote server, by name."""
    return lambda server: urls[server.name]


def replace_path(argv: list[str], path: Path, copy: Path) -> bool:
    """Every argument naming `path` (alone, or after `=`) made to name `copy`; whether one did."""
    target = path.resolve()
    found = False
    for i, arg in enumerate(argv):
        head, sep, tail = arg.rpartition("=")
        value = tail if sep else arg
        try:
            same = bool(value) and Path(value).resolve() == target
        except (OSError, ValueError):
            same = False
        if same:
            argv[i] = f"{head}{sep}{copy}" if sep else str(copy)
            found = True
    return found
