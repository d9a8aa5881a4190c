"""What the analysis commands share: the data and database options, --expect, the error exit,
analyzing first when the data is newer than the store, opening the store, and CSV made inert on a
terminal. Its own module so that each stage's commands
(report, export, prune) import it without importing the analyze command's module, nor it them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from toolproxy.analysis.store.memory import DEFAULT_MEMORY_LIMIT
from toolproxy.term.printable import printable

DATA_OPTION = click.option(
    "--data",
    "data_dir",
    default="toolproxy-data",
    show_default=True,
    envvar="TOOLPROXY_DATA",
    type=click.Path(path_type=Path),
    help="Data directory the proxy records into.",
)
DB_OPTION = click.option(
    "--db",
    "db_path",
    default=None,
    type=click.Path(path_type=Path),
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
    "--memory-limit",
    default=DEFAULT_MEMORY_LIMIT,
    show_default=True,
    envvar="TOOLPROXY_MEMORY_LIMIT",
    callback=_memory_limit_callback,
    help="Memory DuckDB may use (1GB, 512MB, 25% of RAM); past it, it spills to DB.tmp beside the database.",
)


def fail(message: str) -> None:
    """The error exit of every analysis command: the message made printable, on stderr, exit 2."""
    click.echo(printable(f"toolproxy: {message}", lines=True), err=True)
    sys.exit(2)


def expect_callback(_ctx, _param, values: tuple[str, ...]) -> list:
    """--expect rules parsed at the command line, so a mistyped rule is a usage error, not a traceback."""
    from toolproxy.analysis.classify.expectations import RuleError, parse_rules

    try:
        return parse_rules(values)
    except RuleError as exc:
        raise click.BadParameter(str(exc)) from None


def expect_option(help_text: str):
    return click.option(
        "--expect",
        "expect_rules",
        multiple=True,
        metavar="TAG=VALUE:call|none",
        callback=expect_callback,
        help=help_text,
    )


EXPECT_OPTION = expect_option(
    "Override what items expect for this output only, by a rule on tags, e.g. 'category=irrelevance:none' "
    "(repeatable; the last matching rule wins over stored rules and expect tags)."
)


def analyze_if_stale(command: str, data_dir: Path, db_path: Path | None, memory_limit: str | None = None) -> None:
    """Before a command reads the data directory's own database: when segments hold records it has
    not ingested (the proxy, doctor or conformance recorded since the last `analyze`), run
    `analyze` first and say so in one line, rather than report without the new runs. A database
    given with --db may belong to another directory or be a copy: it is read as it is.

    analyze runs as its own process with its summary discarded (this command's stdout is its
    result) and its stderr shown: its progress line on a terminal, its error if it fails.
    """
    from toolproxy.analysis.load.staleness import unanalyzed_segments
    from toolproxy.analysis.store.connection import default_db

    if db_path is not None and db_path != default_db(data_dir):
        return
    stale = unanalyzed_segments(data_dir, default_db(data_dir))
    if not stale:
        return
    n = len(stale)
    click.echo(
        printable(
            f"toolproxy {command}: {n} segment{'s' if n != 1 else ''} in {data_dir} "
            f"{'hold' if n != 1 else 'holds'} records not analyzed yet; analyzing first "
            f"(toolproxy analyze --data {data_dir})"
        ),
        err=True,
    )
    argv = [sys.executable, "-m", "toolproxy.cli", "analyze", "--data", str(data_dir)]
    if memory_limit is not None:  # the limit the user gave this command holds for its analyze too
        argv += ["--memory-limit", memory_limit]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        click.echo(f"toolproxy {command}: analyze failed (above); reading the database as it was", err=True)


def open_store(
    data_dir: Path,
    db_path: Path | None,
    *,
    read_only: bool,
    memory_limit: str | None = DEFAULT_MEMORY_LIMIT,
    half_derived: bool = False,
):
    """The store; a reader is refused while runs are half derived (state.unfinished_runs), since
    their numbers would be wrong, unless `half_derived` (`toolproxy sql`, for looking into it)."""
    from toolproxy.analysis.store.connection import StoreError, connect, default_db
    from toolproxy.analysis.store.state import unfinished_runs

    path = db_path or default_db(data_dir)
    try:
        con = connect(path, read_only=read_only, memory_limit=memory_limit)
    except StoreError as exc:
        fail(str(exc))
    if read_only and not half_derived and (unfinished := unfinished_runs(con)):
        con.close()
        names = ", ".join(unfinished[:5]) + (", ..." if len(unfinished) > 5 else "")
        fail(
            f"{path}: an analyze stopped while deriving {len(unfinished)} run(s) ({names}), whose turns are half "
            "rebuilt; "
            f"run `toolproxy analyze` on this store to finish them (it derives them again from the stored exchanges)"
        )
    return con


def terminal_safe_csv(text: str) -> str:
    """CSV has no escapes of its own, so it is left byte-exact when it goes to a file or a pipe
    (it is data there; echo it with color=True, or click strips escape sequences) and made inert
    only when it goes to a terminal."""
    return printable(text, lines=True) if sys.stdout.isatty() else text
