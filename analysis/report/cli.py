"""`toolproxy report` and `toolproxy compare`: thin commands over analysis.measure.summary and analysis.measure.compare.

Both open the store read-only, so they can run while `toolproxy analyze` is not, and never migrate it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from toolproxy.analysis.options import (
    DATA_OPTION,
    DB_OPTION,
    EXPECT_OPTION,
    MEMORY_LIMIT_OPTION,
    analyze_if_stale,
    fail,
    open_store,
    terminal_safe_csv,
)
from toolproxy.analysis.store.connection import StoreError, default_db
from toolproxy.term.printable import printable


def _write(text: str, output: Path | None, fmt: str) -> None:
    """Run names, models and notes come from recordings: shown inert everywhere, except CSV in a
    file or pipe, which stays byte-exact data."""
    if fmt != "csv":
        text = printable(text, lines=True)
    elif output is None:
        text = terminal_safe_csv(text)
    if output is None:
        click.echo(text, nl=False, color=True)  # color: click would strip escapes from CSV data in a pipe
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    click.echo(f"wrote {output}", err=True)


OUTPUT_OPTION = click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write to this file instead of stdout.",
)


@click.command()
@DATA_OPTION
@DB_OPTION
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "markdown", "json", "csv", "html"]),
    default="table",
    show_default=True,
    help="Output format; html is one self-contained page with charts.",
)
@OUTPUT_OPTION
@click.option("--run", "runs", multiple=True, metavar="RUN", help="Only this run (repeatable; default: every run).")
@click.option("--seed", default=0, show_default=True, type=int, help="Bootstrap RNG seed (reports are reproducible).")
@EXPECT_OPTION
@MEMORY_LIMIT_OPTION
@click.option(
    "--study",
    default=None,
    metavar="NAME",
    help="The tables of a `toolproxy study` instead: models x conditions per stack, stacks x models per "
    "condition, and the paired tests (markdown, json, or html as a heat map).",
)
@click.option(
    "--provenance",
    "with_provenance",
    is_flag=True,
    help="After the table (table and markdown formats; json and html always carry it): per run the model "
    "served, stack, tool parser, chat template, sampling sent, cache hits, versions, and why the number "
    "is what it is.",
)
def report(
    data_dir: Path,
    db_path: Path | None,
    fmt: str,
    output: Path | None,
    runs: tuple[str, ...],
    seed: int,
    expect_rules: list,
    memory_limit: str,
    study: str | None,
    with_provenance: bool,
) -> None:
    """One row per run: call and delivered fidelity with 95% CIs, restraint, answers, non-responses.

    Call fidelity = valid_call turns / turns that were due a call; delivered fidelity counts only
    the calls that reached the harness as calls; the gap between them was lost in the serving
    layer (calls left in text). A run whose every turn was a non-response shows "rej"
    (undefined), never 0%.
    """
    if study is not None and (runs or expect_rules):
        raise click.UsageError("--study reports the study's own runs: leave out --run and --expect")
    if with_provenance and fmt == "csv":
        raise click.UsageError(
            "--provenance goes with --format table or markdown (json and html always carry it; "
            "csv is one row per run, use json for the provenance)"
        )
    from toolproxy.analysis import report as renderers
    from toolproxy.analysis.measure.summary import select_runs, summarize
    from toolproxy.analysis.report import htmlpage, jsondoc, terminal
    from toolproxy.analysis.report.details import page_details
    from toolproxy.analysis.report.provenance import provenance

    analyze_if_stale("report", data_dir, db_path, memory_limit)
    if study is not None:
        _study_tables(data_dir, db_path, fmt, output, seed, study, memory_limit)
        return
    path = db_path or default_db(data_dir)
    con = open_store(data_dir, path, read_only=True, memory_limit=memory_limit)
    try:
        summary = summarize(con, select_runs(con, runs, path), str(path), seed=seed, rules=expect_rules)
        details = page_details(con, summary) if fmt == "html" else None
        origins = provenance(con, data_dir, summary.runs) if with_provenance or fmt in ("json", "html") else {}
    except StoreError as exc:
        fail(str(exc))
    finally:
        con.close()
    if details is not None:
        text = htmlpage.render(summary, details, origins.values())
    elif fmt == "json":
        text = jsondoc.render(summary, origins)
    elif fmt == "table" and output is None and sys.stdout.isatty():
        text = terminal.render(summary, width=max(100, shutil.get_terminal_size().columns))
    else:
        text = renderers.render(summary, fmt)
    if origins and fmt in ("table", "markdown"):
        text += "\n## Provenance\n\n" + "".join(line + "\n" for p in origins.values() for line in p.lines())
    _write(text, output, fmt)


@click.command()
@click.argument("run_a")
@click.argument("run_b")
@DATA_OPTION
@DB_OPTION
@click.option(
    "--by",
    "by",
    type=click.Choice(["category"]),
    default=None,
    help="One row per category (Holm-adjusted p across categories).",
)
@click.option(
    "--metric",
    type=click.Choice(["delivered", "call", "all-valid", "any-valid", "clean"]),
    default="delivered",
    show_default=True,
    help="When an item passes. delivered: every turn due a call delivered a valid call to the harness, "
    "and an item expecting none made no call; call: the same, counting calls left in text; all-valid: "
    "it produced >= 1 turn and every produced turn is a valid_call (the original study's rule); "
    "any-valid: at least one turn is a valid_call; clean: >= 1 valid call and no invalid, "
    "hallucinated or unparseable one.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "markdown", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@OUTPUT_OPTION
@EXPECT_OPTION
@MEMORY_LIMIT_OPTION
def compare(
    run_a: str,
    run_b: str,
    data_dir: Path,
    db_path: Path | None,
    by: str | None,
    metric: str,
    fmt: str,
    output: Path | None,
    expect_rules: list,
    memory_limit: str,
) -> None:
    """Paired test of RUN_A against RUN_B over the items both ran (exact McNemar, both discordant counts).

    Either side may be a quoted wildcard pattern ('bfcl-*-native') that pools every run it
    matches, e.g. one study per category compared condition against condition in one test.
    """
    import dataclasses

    from toolproxy.analysis.measure.compare import compare as paired
    from toolproxy.analysis.measure.summary import is_pattern, select_runs, summarize
    from toolproxy.analysis.report.comparison import RENDERERS, headline

    analyze_if_stale("compare", data_dir, db_path, memory_limit)
    path = db_path or default_db(data_dir)
    con = open_store(data_dir, path, read_only=True, memory_limit=memory_limit)
    try:
        select_runs(con, [run_a, run_b], path)
        result = paired(con, run_a, run_b, metric=metric, by_category=by == "category", rules=expect_rules)
        single = [r for r in (run_a, run_b) if not is_pattern(r)]
        if single and not result.replay:  # the pooled rates need no bootstrap: one resample will do
            runs = summarize(con, single, str(path), resamples=1, rules=expect_rules).runs
            result = dataclasses.replace(result, headlines={s.run: headline(s) for s in runs})
    except StoreError as exc:
        fail(str(exc))
    finally:
        con.close()
    _write(RENDERERS[fmt](result), output, fmt)


def _study_tables(
    data_dir: Path, db_path: Path | None, fmt: str, output: Path | None, seed: int, name: str, memory_limit: str
) -> None:
    from toolproxy.analysis.report import studytables
    from toolproxy.analysis.report.provenance import provenance

    if fmt not in studytables.RENDERERS:
        raise click.UsageError(f"--study renders {', '.join(studytables.RENDERERS)}, not {fmt}")
    path = db_path or default_db(data_dir)
    try:
        plan = studytables.load_plan(data_dir, name)
    except StoreError as exc:
        fail(str(exc))
    con = open_store(data_dir, path, read_only=True, memory_limit=memory_limit)
    try:
        tables = studytables.build(con, plan, str(path), seed=seed)
        origins = provenance(con, data_dir, list(tables.summaries.values()))
    except StoreError as exc:
        fail(str(exc))
    finally:
        con.close()
    _write(studytables.RENDERERS[fmt](tables, [origins[run] for run in tables.summaries]), output, fmt)
