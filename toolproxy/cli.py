"""The `toolproxy` command: one click group; each subcommand lives beside the code it drives.

Subcommands are imported only when used, so `toolproxy serve` never loads DuckDB or numpy and
the analyzer never loads aiohttp.
"""

from __future__ import annotations

import importlib

import click

from toolproxy import __version__

# name -> "module:attribute" of a click command
COMMANDS = {
    "serve": "toolproxy.proxy.cli:serve",
    "doctor": "toolproxy.checks.doctor:doctor",
    "conformance": "toolproxy.checks.conformance:conformance",
    "analyze": "toolproxy.analysis.cli:analyze",
    "sql": "toolproxy.analysis.cli:sql",
    "show": "toolproxy.analysis.cli:show",
    "prune": "toolproxy.analysis.lifecycle.prune:prune_command",
    "show-hint": "toolproxy.conditions.cli:show_hint",
    "report": "toolproxy.analysis.report.cli:report",
    "compare": "toolproxy.analysis.report.cli:compare",
    "demo": "toolproxy.drive.demo:demo",
    "run": "toolproxy.drive.run:run",
    "study": "toolproxy.drive.study:study",
    "replay": "toolproxy.drive.replay:replay",
    "playback": "toolproxy.playback.cli:playback",
    "mcp": "toolproxy.mcp.cli:mcp",
    "export": "toolproxy.analysis.export.cli:export",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="toolproxy")
def main() -> None:
    """Record what tool-using agents and LLM serving stacks say to each other, and measure it honestly.

    Start with `toolproxy serve --upstream URL`, point your harness at the printed address,
    then `toolproxy analyze` and `toolproxy report`.
    """


if __name__ == "__main__":
    main()
