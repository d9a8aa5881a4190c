"""What the analysis commands share: the data and database options, --expect, the error exit,
opening the store, and CSV made inert on a terminal. Its own module so that each stage's commands
(report, export, prune) import it without importing the analyze command's module, nor it them."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from toolproxy.analysis.store.memory import DEFAULT_MEMORY_LIMIT
from toolproxy.term.printable import printable

DATA_OPTION = click.option(
    "--data", "data_dir", default="toolproxy-data", show_default=True, envvar="TOOLPROXY_DATA",
    type=click.Path(path_type=Path), help="Data directory the proxy records into.",
)
DB_OPTION = click.option(
    "--db", "db_path", default=None, type=click.Path(path_type=Path),
    help="DuckDB file (default: DATA/toolproxy.duckdb).",
)



def _memory_limit_callback(_ctx, _param, value: str) -> str:
    from toolproxy.analysis.store.memory import MemoryLimitError, parse_memory_limit

    try:
        parse_memory_limit(value)
    except MemoryLimitError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


MEMORY_LIMIT_OPTION = click.option(
    "--memory-limit", default=DEFAULT_MEMORY_LIMIT, show_default=True, envvar="TOOLPROXY_MEMORY_LIMIT", callback=_memory_limit_callback,
    help="Memory DuckDB may use (1GB, 512MB, 25% of RAM); past it, it spills to DB.tmp beside the database.",
)


def _fail(message: str) -> None:
    click.echo(printable(f"toolproxy: {message}", lines=True), err=True)
    sys.exit(2)


def expect_callback(_ctx, _param, values: tuple[str, ...]) -> list:
    """--expect rules parsed at the command line, so a mistyped rule is a usage error, not a traceback."""
    from toolproxy.analysis.measure.expectations import RuleError, parse_rules

    try:
        return parse_rules(values)
    except RuleError as exc:
        raise click.BadParameter(str(exc)) from None


def expect_option(help_text: str):
    return click.option("--expect", "expect_rules", multiple=True, metavar="TAG=VALUE:call|none",
                        callback=expect_callback, help=help_text)


EXPECT_OPTION = expect_option(
    "Override what items expect for this output only, by a rule on tags, e.g. 'category=irrelevance:none' "
    "(repeatable; the last matching rule wins over stored rules and expect tags)."
)


def _open(data_dir: Path, db_path: Path | None, *, read_only: bool, memory_limit: str | None = DEFAULT_MEMORY_LIMIT):
    from toolproxy.analysis.store.connection import StoreError, connect, default_db

    path = db_path or default_db(data_dir)
    try:
        return connect(path, read_only=read_only, memory_limit=memory_limit)
    except StoreError as exc:
        _fail(str(exc))


def terminal_safe_csv(text: str) -> str:
    """CSV has no escapes of its own, so it is left byte-exact when it goes to a file or a pipe
    (it is data there; echo it with color=True, or click strips escape sequences) and made inert
    only when it goes to a terminal."""
    return printable(text, lines=True) if sys.stdout.isatty() else text
