"""`toolproxy playback --from RUN`: the command that serves a recorded run until Ctrl-C."""

from __future__ import annotations

import asyncio
import ipaddress
import shlex
import signal
import sys
from pathlib import Path

import click

from toolproxy.playback.fixture import Fixture
from toolproxy.playback.options import load, miss_line, playback_options
from toolproxy.playback.server import CannotPlay, PlaybackOptions, start_playback
from toolproxy.proxy.tags import tag_prefix
from toolproxy.runtime.eventloop import run_loop
from toolproxy.term.printable import printable

SHOWN_ISSUES = 20  # lines set aside named one by one at start; the rest counted


@click.command()
@click.option("--from", "source", required=True, metavar="RUN", help="The recorded run to serve.")
@click.option(
    "--data",
    "data_dir",
    default="toolproxy-data",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The data directory the run was recorded in.",
)
@click.option("--upstream", default=None, metavar="URL", help="Where misses go with --on-miss forward or record.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8787, show_default=True, type=int, help="Port to listen on (0 picks a free one).")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A name besides localhost and the listening address that the Host check accepts ('*': no check).",
)
@playback_options
def playback(source, data_dir, upstream, host, port, allowed_hosts, on_miss, pace, match):
    """Serve a recorded run's replies to any harness, offline: toolproxy playback --from RUN.

    Point the harness at the printed address as at `serve`. Each request gets the recorded reply
    of the matching exchange (status and bytes as recorded; identical requests get their recorded
    replies in turn); see the manual's "Agent tests from recordings" for the matching rules.
    """
    if not _loopback(host):
        raise click.BadParameter(
            "playback answers anyone with the recorded prompts and replies, without a token: "
            "it listens on a loopback address only (127.0.0.1, ::1, localhost)",
            param_hint="--host",
        )
    fixture, rules = load(data_dir, source, match)
    options = PlaybackOptions(
        run=source,
        on_miss=on_miss,
        upstream=upstream,
        pace=pace,
        host=host,
        port=port,
        allowed_hosts=tuple(allowed_hosts),
        data_dir=data_dir,
        on_missed=miss_line,
    )
    if on_miss != "fail" and not upstream:
        raise click.UsageError(f"--on-miss {on_miss} needs --upstream URL (where a miss is sent)")
    try:
        run_loop(_serve(fixture, rules, options))
    except CannotPlay as exc:
        raise click.ClickException(str(exc)) from None


def mcp_lines(fixture: Fixture, url: str, options: PlaybackOptions) -> list[str]:
    """How to reach each MCP server the run recorded: an HTTP one here, under its name; a stdio
    one from the agent's configuration, as the command that plays it."""
    out = []
    for name, transport in sorted(fixture.mcp_servers.items()):
        if transport == "http":
            paths = sorted({x.path for x in fixture.exchanges if x.mcp_server == name})
            where = f"point its URL at {url}{tag_prefix(mcp_server=name)}{paths[0] if paths else '/mcp'}"
        else:
            where = (
                f"configure its command as: toolproxy mcp --playback {shlex.quote(options.run)} --name "
                f"{shlex.quote(name)} --data {shlex.quote(str(options.data_dir.resolve()))}"
            )
        out.append(printable(f"toolproxy playback: MCP server {name} ({transport}): {where}"))
    return out


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower().rstrip(".") == "localhost"


async def _serve(fixture: Fixture, rules, options: PlaybackOptions) -> None:
    running = await start_playback(fixture, rules, options)
    set_aside = fixture.set_aside_line()
    print(
        f"toolproxy playback: listening on {running.url}; playing run {printable(options.run)} "
        f"({len(fixture.exchanges)} exchanges) from {printable(str(options.data_dir.resolve()))}; on miss: "
        f"{options.on_miss}" + (f"; {set_aside}, listed on stderr" if set_aside else ""),
        flush=True,
    )
    for line in mcp_lines(fixture, running.url, options):
        print(line, flush=True)
    for issue in fixture.set_aside[:SHOWN_ISSUES]:
        print(f"toolproxy playback: {printable(issue.line())}", file=sys.stderr, flush=True)
    if len(fixture.set_aside) > SHOWN_ISSUES:
        print(
            f"toolproxy playback: and {len(fixture.set_aside) - SHOWN_ISSUES} more lines set aside",
            file=sys.stderr,
            flush=True,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.stop()
        print(f"toolproxy playback: {running.stats.line()}", file=sys.stderr, flush=True)
