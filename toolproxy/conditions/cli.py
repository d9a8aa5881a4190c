"""`toolproxy show-hint`: the exact tool block a condition injects, e.g. for a paper's appendix."""

from __future__ import annotations

import json
from pathlib import Path

import click

from toolproxy.conditions.toolblock import render_block, render_constrained_block, tool_functions


@click.command("show-hint")
@click.option(
    "--tools",
    "tools_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="JSON file: an OpenAI `tools` array, or a request body that has one.",
)
@click.option(
    "--condition",
    type=click.Choice(["hint", "text", "constrained"]),
    default="hint",
    show_default=True,
    help="hint and text inject the same block; constrained describes the JSON reply instead.",
)
@click.option("--constrained-forced", is_flag=True, help="The constrained block without the final-answer option.")
def show_hint(tools_path: Path, condition: str, constrained_forced: bool) -> None:
    """Print the tool block injected into the system message, byte for byte."""
    try:
        data = json.loads(tools_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.UsageError(f"--tools {tools_path}: cannot read it as JSON: {exc}") from None
    tools = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(tools, list) or not tool_functions(tools):
        raise click.UsageError(
            f'--tools {tools_path}: no function tools found; expected [{{"type": "function", "function": '
            '{"name": ..., "parameters": ...}}, ...] or an object with a "tools" array'
        )
    if condition == "constrained":
        block = render_constrained_block(tools, forced=constrained_forced)
    else:
        block = render_block(tools)
    click.echo(block, nl=False)
