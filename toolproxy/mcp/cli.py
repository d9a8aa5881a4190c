"""`toolproxy mcp`: an MCP server's traffic recorded beside the model's, or played back.

    toolproxy mcp --name fs --run R -- npx -y @modelcontextprotocol/server-filesystem /tmp   (stdio)
    toolproxy mcp --name docs --upstream https://host/mcp-root                              (HTTP)
    toolproxy mcp --name fs --playback R [--on-miss record -- npx ...]                      (playback)

The stdio wrapper records through the same pieces as `serve`: its writer settings, redaction
(with the server's secret environment values and credentials kept off its command line, stderr
and messages), `--mask`, the disk budget and retention, the crash bound. The HTTP proxy is
`serve` itself, each exchange recorded as the MCP server's (`proxy/mcptraffic.py`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import click

from toolproxy.proxy.cli import config_from_options, harness_serve_options, make_data_dir, tags_from_options
from toolproxy.proxy.config import ProxyConfig

# Serve's flags that say nothing about an MCP server's traffic: hidden here, and refused if given.
_MODEL_ONLY = ("condition", "stack", "chat_template", "parser", "constrained_forced", "bridge", "sample")
# Launchers whose first argument that is no flag names the server better than they do.
_LAUNCHERS = frozenset({"npx", "uvx", "bunx", "pnpx", "node", "python", "python3", "deno", "docker", "uv", "pipx"})


def server_name(command: tuple[str, ...], upstream: str | None) -> str:
    """A name for a server started by `command` (or at `upstream`) when --name gives none."""
    if upstream:
        from yarl import URL

        return URL(upstream).host or "mcp"
    name = Path(command[0]).name
    if name in _LAUNCHERS:
        for arg in command[1:]:
            if not arg.startswith("-") and arg not in ("run", "-m", "exec"):
                return Path(arg.rstrip("/")).name or name
    return name


def _mcp_options(fn):
    fn = harness_serve_options(fn)
    for param in fn.__click_params__:
        if param.name == "upstream":
            param.required = False
            param.envvar = None
            param.help = "The MCP server's HTTP root (Streamable HTTP or HTTP+SSE): proxy it instead of a command."
        elif param.name in _MODEL_ONLY:
            param.hidden = True
    return fn


@click.command(context_settings={"allow_interspersed_args": False})
@_mcp_options
@click.option("--name", default=None, help="The server's name, as the agent's configuration names it.")
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", help="A tag on every record (episode=3, ...).")
@click.option(
    "--playback",
    "playback_run",
    default=None,
    metavar="RUN",
    help="Answer the agent from this recorded run's exchanges with the server named --name (stdio).",
)
@click.option(
    "--on-miss",
    type=click.Choice(("fail", "forward", "record")),
    default="fail",
    show_default=True,
    help="With --playback: fail: a JSON-RPC error naming the closest recorded request; forward: send the request "
    "to the real server (the command after --); record: the same, recorded into the played run.",
)
@click.option(
    "--match",
    "match",
    multiple=True,
    metavar="RULE",
    help="With --playback: tune matching as playback's --match does (ignore=PATH, mask=REGEX, episodes=off, ...).",
)
@click.argument("command", nargs=-1, required=False, type=click.UNPROCESSED)
def mcp(name, tags, playback_run, on_miss, match, command, **options):
    """Record an MCP server's traffic: toolproxy mcp [--name N] [--run R] -- CMD ARGS... (stdio), or
    toolproxy mcp --upstream URL (Streamable HTTP); or play one back: toolproxy mcp --playback R --name N.

    Put it where the agent's MCP configuration names the server (`toolproxy run --mcp-config`
    does that for you): every JSON-RPC message passes unchanged both ways, and each request with
    its response, each notification, is recorded beside the model's traffic of the same run.
    """
    for key in _MODEL_ONLY:
        if options.get(key) not in (None, False, "native"):
            raise click.UsageError(f"--{key.replace('_', '-')} applies to model traffic, not to an MCP server's")
    extra = tags_from_options(tags)
    upstream = options["upstream"]
    if playback_run is not None:
        if not name:
            raise click.UsageError("--playback needs --name: the recorded server to answer as")
        _playback(options, name, playback_run, on_miss, match, extra, command)
        return
    if upstream is not None:
        if command:
            raise click.UsageError("give --upstream URL or a command after --, not both")
        if extra:
            raise click.UsageError(
                "--tag is for stdio servers; over HTTP, tag the URL: http://HOST:PORT/t/episode=3/mcp"
            )
        config = dataclasses.replace(
            config_from_options(**options),
            mcp_server=name or server_name((), upstream),
            fingerprint=False,
            live_page=False,
        )
        make_data_dir(config)
        from toolproxy.proxy.server import run as run_proxy

        run_proxy(config)
        return
    if not command:
        raise click.UsageError(
            "give the server's command after --, e.g. toolproxy mcp -- npx -y SERVER, or --upstream URL"
        )
    config = config_from_options(**{**options, "upstream": "http://127.0.0.1:1", "quiet": True})
    make_data_dir(config)
    sys.exit(record_stdio(config, name or server_name(command, None), list(command), extra))


def record_stdio(config: ProxyConfig, name: str, argv: list[str], tags: dict[str, str]) -> int:
    """Run the server behind the stdio relay, recording into config.data_dir; its exit status."""
    from toolproxy.mcp.relay import StdioRelay
    from toolproxy.mcp.session import StdioSession
    from toolproxy.proxy.app import exchange_writer
    from toolproxy.proxy.headers import SecretScrubber, load_redactor, secret_env_values
    from toolproxy.proxy.parts import housekeeper_for, masker_for, record_transform
    from toolproxy.record.model import now

    scrubber = SecretScrubber(load_redactor(config.data_dir), secret_env_values(os.environ))
    writer = exchange_writer(config, quiet=True)
    housekeeper = (
        housekeeper_for(config, writer) if config.retain_seconds is not None or config.max_disk is not None else None
    )
    masking = record_transform(None, masker_for(config))

    def transform(rec):
        rec = scrub(rec, scrubber)
        return masking(rec) if masking is not None else rec

    writer.transform = transform
    writer.start()
    if housekeeper is not None:
        housekeeper.start()
    tags = dict(tags)
    session = StdioSession(
        writer.submit,
        server=name,
        run=tags.pop("run", None) or config.default_run(now()),
        episode=tags.pop("episode", None),
        item=tags.pop("item", None),
        tags=tags,
    )
    relay = StdioRelay(
        argv,
        session,
        limit=config.max_body,
        shown_command=scrubber.command(argv),
        behind=lambda: writer.behind,
        stall_timeout=writer.stall_timeout,
    )
    try:
        return relay.run()
    finally:
        if housekeeper is not None:
            housekeeper.stop()
        writer.close()


def scrub(rec, scrubber):
    """The record with the server's secrets replaced in its text bodies (on the writer's thread)."""
    changes = {}
    for field in ("request_body", "response_body"):
        value = getattr(rec, field)
        if isinstance(value, str) and getattr(rec, f"{field}_encoding") != "base64":
            clean = scrubber.text(value)
            if clean is not value and clean != value:
                changes[field] = clean
    return dataclasses.replace(rec, **changes) if changes else rec


def _playback(options: dict, name: str, run: str, on_miss: str, match: tuple, tags: dict, command: tuple) -> None:
    from toolproxy.mcp.playback import StdioPlayback
    from toolproxy.playback.options import load

    if on_miss != "fail" and not command:
        raise click.UsageError(f"--on-miss {on_miss} needs the real server's command after --")
    data_dir = options["data_dir"]
    fixture, rules = load(data_dir, run, match)
    exchanges = fixture.stdio.get(name, [])
    if not exchanges:
        known = ", ".join(f"{k} ({v})" for k, v in sorted(fixture.mcp_servers.items())) or "none"
        click.echo(
            f"toolproxy mcp: run {run} recorded no stdio exchanges with a server named {name} (its MCP servers: "
            f"{known}); every request will miss",
            err=True,
        )
    real = None
    if command:
        real = list(command)
        if on_miss == "record":
            real = [
                sys.executable,
                "-m",
                "toolproxy.cli",
                "mcp",
                "--data",
                str(Path(data_dir).resolve()),
                "--run",
                run,
                "--name",
                name,
                *[f"--tag={k}={v}" for k, v in tags.items()],
                "--",
                *command,
            ]
    player = StdioPlayback(
        exchanges,
        rules,
        server=name,
        episode=tags.get("episode"),
        on_miss=on_miss,
        real_server=real,
        limit=64 * 1024 * 1024,
    )
    sys.exit(player.run())
