"""`toolproxy study`: the same harness across stacks, models and interface conditions, then the tables.

A study is a matrix: every upstream (`--upstream NAME=URL`, repeatable) crossed with every model
(`--model`, repeatable), every condition and every repeat. Each cell is a run named
NAME[-STACK][-MODEL]-COND[-k] whose requests carry its condition, and its model as an
`upstream_model` tag the proxy puts in the request (toolproxy/proxy/modelswap.py), so the harness
is the same unmodified command in every cell and only the stack, the model or the interface
changes. One in-process proxy per upstream serves the study, so each upstream is fingerprinted
once and its runs are attributed to it.

The study's state is a small JSON file in the data directory, written after every run: Ctrl-C
leaves the finished runs usable, and running the same command again skips them, as a test runner
or a benchmark runner continues. A run cut short is kept under its own name (marked interrupted)
and redone under a fresh one, so a partial run's turns never mix with a complete one's. A
harness's exit code is its own verdict on its tasks (an agent that never got its call as a call
may well exit 1), not a reason to discard what its cell recorded: it is kept beside the cell.

Each upstream is asked whether it answers before the first cell, so a wrong port costs one line,
not a study of connect errors; one that stops answering mid-study stops the study, and the cell
it cut is redone on the next run. The upstream's URL is not part of the study's identity (its
name is), so the same command with a corrected --upstream resumes the same study.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from toolproxy.analysis.measure.runline import from_report
from toolproxy.conditions import NAMES
from toolproxy.drive.harness import harness_env
from toolproxy.drive.run import (
    NO_REQUEST,
    interrupt_note,
    proxy_address_line,
    run_child,
    run_child_relayed,
    start_proxy,
    toolproxy_cli,
    unreachable_upstream,
)
from toolproxy.proxy.cli import config_from_options, harness_serve_options, make_data_dir, tags_from_options
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.listener import LINE_LIMIT
from toolproxy.proxy.modelswap import TAG as MODEL_TAG
from toolproxy.proxy.tags import tag_prefix
from toolproxy.runtime.eventloop import run_loop
from toolproxy.term.printable import printable
from toolproxy.term.progress import Progress, duration

STUDY_DIR = "studies"
_UPSTREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*$")
_NOT_IN_RUN_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


# A cell's status. Done: its harness ran to its end (whatever its exit code, kept beside it).
# Redone on the next run of the study: pending; interrupted and unreached (the upstream stopped
# answering), each under a fresh run name since it recorded something; no_requests (the harness
# sent the proxy nothing) under the same name, since it recorded nothing.
PENDING, DONE, INTERRUPTED, UNREACHED, NO_REQUESTS = "pending", "done", "interrupted", "unreached", "no_requests"
STATUS_WORDS = {
    PENDING: "not run yet",
    INTERRUPTED: "interrupted: run the study again to redo it",
    UNREACHED: "the upstream stopped answering: run the study again once it answers",
    NO_REQUESTS: NO_REQUEST.split(":")[0],
}


@dataclass
class Planned:
    condition: str
    repeat: int  # 1-based
    run: str  # the run name the finished attempt was recorded under
    status: str = PENDING
    exit_code: int | None = None  # the harness's own verdict on its tasks, kept beside the cell
    seconds: float | None = None
    attempts: list[str] = field(default_factory=list)  # earlier run names of cut-short attempts
    stack: str | None = None  # the upstream's name (None: the study's one unnamed upstream)
    model: str | None = None  # the model sent upstream (None: the harness's own)


@dataclass
class Study:
    name: str
    command: list[str]
    upstream: str  # the first upstream's URL (the only one before studies had several)
    conditions: list[str]
    repeat: int
    runs: list[Planned]
    upstreams: list[list] = field(default_factory=list)  # [name or None, url], in the order given
    models: list[str] = field(default_factory=list)

    @classmethod
    def plan(
        cls,
        name: str,
        command: list[str],
        upstreams: list[tuple[str | None, str]],
        conditions: list[str],
        repeat: int,
        models: list[str] | None = None,
    ) -> Study:
        models = list(models or [])
        runs = [
            Planned(c, k, run_name(name, c, k, repeat, stack, model), stack=stack, model=model)
            for k in range(1, repeat + 1)
            for stack, _ in upstreams
            for model in (models or [None])
            for c in conditions
        ]
        return cls(name, command, upstreams[0][1], conditions, repeat, runs, [list(u) for u in upstreams], models)

    def urls(self) -> dict[str | None, str]:
        return {name: url for name, url in self.upstreams} if self.upstreams else {None: self.upstream}

    def plan_parts(self) -> dict[str, object]:
        """What makes the study the same study: its command and matrix. An upstream's URL is not
        part of it (its name is): a corrected --upstream resumes the study."""
        return {
            "command": self.command,
            "conditions": self.conditions,
            "repeats": self.repeat,
            "upstream names": list(self.urls()),
            "models": self.models,
        }

    def status_text(self, p: Planned) -> str:
        """A cell's status in words, the harness's exit code beside a finished one."""
        if p.status != DONE:
            return STATUS_WORDS.get(p.status, p.status)
        return "done" if not p.exit_code else f"done (harness exited {p.exit_code})"

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Study:
        doc = json.loads(path.read_text())
        runs = []
        for r in doc["runs"]:
            # Before exit codes were kept beside the cell, a harness that exited non-zero marked
            # its cell "failed" and the cell was run again on every rerun: it finished, so it is done.
            runs.append(Planned(**{**r, "status": DONE if r.get("status") == "failed" else r.get("status", PENDING)}))
        return cls(**{**doc, "runs": runs})


def run_name(
    name: str, condition: str, repeat: int, repeats: int, stack: str | None = None, model: str | None = None
) -> str:
    """NAME[-STACK][-MODEL]-COND[-k]: the stack part when the upstreams are named, the model part
    when models are given (with every character a run name should not hold as `_`)."""
    parts = [name, stack, model_label(model) if model is not None else None, condition]
    return "-".join(p for p in parts if p) + (f"-{repeat}" if repeats > 1 else "")


def model_label(model: str) -> str:
    return _NOT_IN_RUN_NAME.sub("_", model).strip("_") or "model"


def parse_upstreams(values: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """`NAME=URL` or a bare URL (only when it is the study's one upstream), names distinct."""
    out: list[tuple[str | None, str]] = []
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or "://" in name:
            name, url = None, value
        elif not _UPSTREAM_NAME.match(name):
            raise click.BadParameter(
                f"{value!r}: an upstream name is letters, digits, '_' and '.' (NAME=URL)", param_hint="--upstream"
            )
        out.append((name, url))
    names = [n for n, _ in out]
    if len(out) > 1 and None in names:
        raise click.BadParameter("name every upstream (NAME=URL) when the study has several", param_hint="--upstream")
    if len(set(names)) != len(names):
        raise click.BadParameter("give each upstream its own name", param_hint="--upstream")
    return out


def state_path(data_dir: Path, name: str) -> Path:
    return data_dir / STUDY_DIR / f"{name}.json"


def _resume(path: Path, fresh: Study) -> Study:
    """The saved study if it is the same study, its upstream URLs updated to the ones given; a
    changed command or matrix is a usage error that says what changed."""
    if not path.exists():
        return fresh
    try:
        saved = Study.load(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise click.ClickException(
            f"{path} is not a readable study state ({exc}); move it away to start over"
        ) from None
    was, now = saved.plan_parts(), fresh.plan_parts()
    changed = [part for part in now if was[part] != now[part]]
    if changed:
        part = changed[0]
        raise click.UsageError(
            printable(
                f"the study {fresh.name!r} in {path} was planned with other {', '.join(changed)} (its {part}: "
                f"{_shown(was[part])}; given: {_shown(now[part])}); give the same to resume it, choose another "
                "--name, or move that file away to start over"
            )
        )
    before = saved.urls()
    for name, url in fresh.urls().items():
        if before.get(name) != url:
            label = f"upstream {name}" if name else "the upstream"
            done = sum(1 for p in saved.runs if p.stack == name and p.status == DONE)
            click.echo(
                printable(
                    f"study {saved.name}: {label} is now {url} (was {before.get(name)}); "
                    f"{done} cell{'s' if done != 1 else ''} done against it keep their recordings"
                ),
                err=True,
            )
    saved.upstreams = [list(u) for u in fresh.upstreams]
    saved.upstream = fresh.upstream
    return saved


def _shown(value: object) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value) or "none"
    return str(value)


def _typical(done: list[float]) -> float:
    return sorted(done)[len(done) // 2]


def cell_line(study: str, planned: Planned, cells: int, finished: int, done: list[float], left: int) -> str:
    """The line that opens a run: which cell of the matrix it is, how many are done, the time left
    (from the median duration of the runs done, once there is one)."""
    what = ", ".join(
        f"{k} {v}"
        for k, v in (("stack", planned.stack), ("model", planned.model), ("condition", planned.condition))
        if v
    )
    text = f"study {study}: {planned.run} ({what}); {finished}/{cells} cells done"
    if done and left:
        text += f", about {duration(_typical(done) * left)} left"
    return printable(text)  # the names are the user's: a model name may hold control characters


def cell_prefix(planned: Planned, tags: dict[str, str]) -> str:
    """The tag prefix of a cell's requests: its run, condition and model, and the study's --tag values."""
    cell_tags = {**tags, MODEL_TAG: planned.model} if planned.model is not None else tags
    return tag_prefix(planned.run, planned.condition, **cell_tags)


# Of the request line (LINE_LIMIT), what the tag prefix may take: the rest is the harness's method,
# its own path and its query.
TAGS_ROOM = LINE_LIMIT - 1024


def too_long(study: Study, tags: dict[str, str]) -> str | None:
    """Why the cells' tag prefixes cannot go in a request line, or None. The prefix carries the
    model name: one of 9,000 characters made every request a 400 from the HTTP parser, and each
    run ended with nothing recorded while the study went on."""
    longest = max(study.runs, key=lambda p: len(cell_prefix(p, tags)))
    size = len(cell_prefix(longest, tags)) + len("~99")  # a rerun of a failed cell adds ~N to its run name
    if size <= TAGS_ROOM:
        return None
    return (
        f"the tags of cell {longest.run[:60]!r}... take {size:,} characters of the request line, which holds "
        f"{LINE_LIMIT:,} in all: give a shorter --model, --name or --tag"
    )


def run_line(run: str, exchanges: int, elapsed: float, done: list[float], runs_after: int) -> str:
    """The progress line while one run's harness works: its exchanges so far and their rate, and
    the study's time left, from the median duration of the runs done (once there is one)."""
    rate = exchanges / elapsed * 60 if elapsed > 0 else 0.0
    text = f"  {printable(run)}: {exchanges} exchanges in {duration(elapsed)} ({rate:,.1f}/min)"
    if done:
        typical = _typical(done)
        text += f", study about {duration(max(typical - elapsed, 0.0) + typical * runs_after)} left"
    return text


class HarnessOutput:
    """The harness's output passed through while a progress line is drawn on the same terminal:
    the line is erased before each piece and drawn again only at the start of a line, so the two
    never run into each other."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.at_line_start = True
        self.streams = {1: sys.stdout.buffer, 2: sys.stderr.buffer}

    def __call__(self, fd: int, chunk: bytes) -> None:
        self.progress.clear()
        out = self.streams[fd]
        out.write(chunk)
        out.flush()
        self.at_line_start = chunk.endswith(b"\n")

    def show(self, text: str) -> None:
        if self.at_line_start:
            self.progress.show(text)


class Stop(Exception):
    """The study cannot go on (an upstream does not answer): the cells left stay for the next run."""


async def _check_upstreams(study: Study, stacks: set[str | None]) -> None:
    """Every upstream a pending cell needs answers HTTP, or Stop with one line per one that does not:
    before the first cell, as doctor checks before its first probe."""
    urls = study.urls()
    problems = []
    for stack in sorted(stacks, key=lambda s: list(urls).index(s)):
        problem = await unreachable_upstream(urls[stack])
        if problem is not None:
            problems.append(f"{f'upstream {stack}: ' if stack else ''}{problem}")
    if problems:
        raise Stop(
            "; ".join(problems) + " No cell was run: start the model server or correct --upstream, then run "
            "the same command again (the study resumes)."
        )


async def _run_study(config: ProxyConfig, study: Study, save, tags: dict[str, str], progress: Progress) -> bool:
    """Every pending run in order; False when the user interrupted (the rest stays pending)."""
    urls = study.urls()
    stacks = {p.stack for p in study.runs if p.status != DONE}
    if stacks:
        await _check_upstreams(study, stacks)
    proxies = {}
    try:
        for stack in stacks:
            stack_config = dataclasses.replace(config, upstream=urls[stack])
            proxies[stack] = await start_proxy(stack_config)
            click.echo(proxy_address_line("study", proxies[stack], stack_config), err=True)
        return await _run_cells(study, proxies, save, tags, progress)
    finally:
        for proxy in proxies.values():
            await proxy.stop()


def _next_name(study: Study, planned: Planned) -> None:
    """A cell redone after an attempt that recorded something runs under a fresh name (RUN~2 ...),
    so the earlier attempt's turns never mix with its own; one that recorded nothing keeps its name."""
    if planned.status in (INTERRUPTED, UNREACHED):
        planned.attempts.append(planned.run)
        base_name = run_name(study.name, planned.condition, planned.repeat, study.repeat, planned.stack, planned.model)
        planned.run = f"{base_name}~{len(planned.attempts) + 1}"


async def _run_cells(study: Study, proxies: dict, save, tags: dict[str, str], progress: Progress) -> bool:
    todo = [p for p in study.runs if p.status != DONE]
    durations = [p.seconds for p in study.runs if p.status == DONE and p.seconds]
    finished = len(study.runs) - len(todo)
    relay = HarnessOutput(progress) if progress.enabled else None
    for i, planned in enumerate(todo, 1):
        _next_name(study, planned)
        click.echo(cell_line(study.name, planned, len(study.runs), finished, durations, len(todo) - i + 1), err=True)
        proxy = proxies[planned.stack]
        counters = proxy.state.counters
        base = proxy.url + cell_prefix(planned, tags)
        env = {**os.environ, **harness_env(base, os.environ)}
        start, seen, unanswered = time.monotonic(), counters.total, _unanswered(counters)
        if relay is not None:
            env.setdefault("PYTHONUNBUFFERED", "1")  # its output piped through here, as it comes
            child = asyncio.ensure_future(run_child_relayed(study.command, env, relay, interrupt_note(proxy)))
        else:
            child = asyncio.ensure_future(run_child(study.command, env, interrupt_note(proxy)))
        while not child.done():
            await asyncio.wait([child], timeout=1.0)
            if relay is not None:
                relay.show(
                    run_line(
                        planned.run,
                        counters.total - seen,
                        time.monotonic() - start,
                        durations,
                        len(todo) - i,
                    )
                )
        progress.clear()
        result = child.result()
        planned.seconds = round(time.monotonic() - start, 1)
        planned.exit_code = result.returncode
        exchanges = counters.total - seen
        problem = None
        if result.interrupted:
            planned.status = INTERRUPTED
        elif exchanges == 0:
            planned.status = NO_REQUESTS
        elif _unanswered(counters) - unanswered == exchanges and (
            problem := await unreachable_upstream(proxy.state.config.upstream)
        ):
            planned.status = UNREACHED
        else:
            planned.status = DONE
        save()
        if result.interrupted:
            return False
        if problem is not None:
            raise Stop(
                f"{planned.run}: no request got an answer, and {problem} The cells left were not run; "
                "run the same command again once it answers (the study resumes, this cell under a fresh name)."
            )
        if planned.status == NO_REQUESTS:
            click.echo(f"  {planned.run}: {NO_REQUEST}; a rerun of this command runs it again", err=True)
        elif result.returncode != 0:
            click.echo(
                f"  {planned.run}: the harness exited {result.returncode}, its own verdict on its tasks (its "
                "output above says why); the cell's recording is kept and measured like any other",
                err=True,
            )
        if planned.status == DONE:
            durations.append(planned.seconds)
            finished += 1
    return True


def _unanswered(counters) -> int:
    """Exchanges so far that got no answer from the upstream at all (it could not be connected to,
    or said nothing in time): when they are all of a cell's, the upstream is asked whether it answers."""
    return counters.errors.get("connect", 0) + counters.errors.get("timeout", 0)


def _report_runs(data_dir: Path, runs: list[str]) -> dict[str, dict]:
    args = ["report", "--data", str(data_dir), "--format", "json"]
    for r in runs:
        args += ["--run", r]
    done = toolproxy_cli(*args)
    if done.returncode != 0:
        return {}
    return {r["run"]: r for r in json.loads(done.stdout).get("runs", [])}


def _compare(data_dir: Path, a: str, b: str) -> dict | None:
    done = toolproxy_cli("compare", a, b, "--data", str(data_dir), "--format", "json")
    return json.loads(done.stdout) if done.returncode == 0 else None


def render(study: Study, reports: dict[str, dict], comparisons: dict[str, dict | None], html: Path | None) -> str:
    """The study as markdown: what ran, per run the two fidelities, and each condition against the
    first (within the same stack, model and repeat)."""
    axes = (["stack"] if None not in study.urls() else []) + (["model"] if study.models else [])
    upstreams = ", ".join(f"{n}={u}" if n else u for n, u in study.urls().items())
    lines = [
        f"# Study {study.name}",
        "",
        f"Command: `{' '.join(study.command)}`  ",
        f"Upstream: {upstreams}  ",
        *([f"Models: {', '.join(study.models)}  "] if study.models else []),
        f"Conditions: {', '.join(study.conditions)}; repeats: {study.repeat}",
        "",
        "| run | condition | "
        + "".join(f"{axis} | " for axis in axes)
        + "status | episodes | call fidelity [95% CI] | delivered fidelity [95% CI] | non-responses |",
        "|---|---|" + "---|" * len(axes) + "---|---|---|---|---|",
    ]
    for p in study.runs:
        r = reports.get(p.run)
        head = f"| {p.run} | {p.condition} | " + "".join(f"{getattr(p, axis)} | " for axis in axes)
        if r is None:
            lines.append(f"{head}{study.status_text(p)} | 0 | - | - | - |")
            continue
        cells = from_report(r).cells()
        lines.append(
            f"{head}{study.status_text(p)} | {r.get('episodes', 0)} | {cells['call']} | "
            f"{cells['delivered']} | {cells['cause'] or 'none'} |"
        )
    if comparisons:
        lines += [
            "",
            f"Paired against {study.conditions[0]} over the same items (exact McNemar; "
            "A = the first condition, B = the other):",
            "",
            "| B | metric | paired items | A only | B only | p |",
            "|---|---|---|---|---|---|",
        ]
        for b, c in comparisons.items():
            if c is None:
                lines.append(f"| {b} | - | no items in common | - | - | - |")
                continue
            o = c["overall"]
            lines.append(f"| {b} | {c['metric']} | {o['paired']} | {o['a_only']} | {o['b_only']} | {o['p']:.4g} |")
    if html is not None:
        lines += ["", f"HTML report: {html}"]
    return "\n".join(lines) + "\n"


def _not_condition(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        raise click.BadParameter(
            f"a study runs each of --conditions (comma-separated), e.g. --conditions {value}; "
            "--condition is serve's and run's one condition",
            ctx,
            param,
        )


def _several_upstreams(fn):
    """serve's --upstream, repeatable and optionally named, for a study across stacks; serve's
    --condition left out, so a `--condition native,text` is answered with --conditions
    instead of being taken as the proxy's one condition."""
    fn.__click_params__ = [p for p in fn.__click_params__ if p.name not in ("upstream", "condition")]
    fn = click.option("--condition", hidden=True, expose_value=False, callback=_not_condition)(fn)
    return click.option(
        "--upstream",
        "upstreams",
        multiple=True,
        required=True,
        envvar="TOOLPROXY_UPSTREAM",
        show_envvar=True,
        metavar="[NAME=]URL",
        help="Model server root; repeat as NAME=URL (e.g. jinja=http://127.0.0.1:8080) to run the "
        "study on each, the name becoming part of its run names.",
    )(fn)


# Launchers before the harness itself in a command line: its name is the next argument.
_LAUNCHERS = re.compile(r"(python|pypy)[\d.]*|uv|uvx|poetry|pipx|pdm|hatch|run|exec|node|npx|bash|sh|env|time|nice")


def harness_name(command: list[str] | tuple[str, ...]) -> str:
    """The study's default name: the harness's own (`python examples/react_agent.py` -> react_agent),
    as docker names a container after its image; a name that says nothing ("study") would print
    as `study study: study-native ...`."""
    for arg in command:
        base = Path(arg).name
        if not base or base.startswith("-") or "=" in base or _LAUNCHERS.fullmatch(base):
            continue
        stem = re.sub(r"\.(py|sh|js|mjs|ts)$", "", base)
        cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.")
        if cleaned:
            return cleaned
    return "study"


@click.command(context_settings={"allow_interspersed_args": False})
@_several_upstreams
@harness_serve_options
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help="Model to ask the upstream for instead of the harness's (repeatable: the study runs each); "
    "the proxy rewrites the request's model field, the harness is untouched.",
)
@click.option(
    "--conditions",
    default="native,hint,text,constrained",
    show_default=True,
    help="Comma-separated conditions, the first is the baseline of the paired tests.",
)
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 100), help="Runs per cell.")
@click.option(
    "--name",
    default=None,
    help="Study name; runs are NAME[-STACK][-MODEL]-COND[-k] (default: the harness's name, e.g. "
    "react_agent for python examples/react_agent.py).",
)
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", help="Extra tag on every request (repeatable).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def study(upstreams, models, conditions, repeat, name, tags, command, **options):
    """Run a harness across upstreams, models and interface conditions: toolproxy study --upstream URL -- CMD ARGS...

    Each cell is a run NAME[-STACK][-MODEL]-COND[-k] in the data directory (STACK when upstreams are
    named, MODEL when --model is given). Ctrl-C keeps the finished runs; running the same command
    again resumes. At the end: per run call and delivered fidelity with 95% intervals,
    non-responses by kind, and a paired McNemar test of each condition against the first.
    """
    wanted = [c.strip() for c in conditions.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in NAMES]
    if unknown or not wanted or len(set(wanted)) != len(wanted):
        raise click.BadParameter(
            f"give distinct conditions from {', '.join(NAMES)} (got {conditions!r})", param_hint="--conditions"
        )
    name = harness_name(command) if name is None else name
    if "/" in name or not name:
        raise click.BadParameter("a study name may not contain '/'", param_hint="--name")
    labels = [model_label(m) for m in models]
    if len(set(labels)) != len(labels) or not all(models):
        raise click.BadParameter(
            "give distinct model names (in run names they must differ in more than punctuation)", param_hint="--model"
        )
    named = parse_upstreams(upstreams)
    if len(named) > 1 and options.get("port"):
        raise click.BadParameter(
            "a study over several upstreams runs a proxy for each: leave --port out", param_hint="--port"
        )
    options.update(quiet=True, condition="native")  # each cell's condition travels in its requests' tags
    config = config_from_options(upstream=named[0][1], **options)
    for _, url in named[1:]:
        config_from_options(upstream=url, **options)  # each upstream is checked as serve would check it
    extra = tags_from_options(tags)
    planned = Study.plan(name, list(command), named, wanted, repeat, list(models))
    problem = too_long(planned, extra)
    if problem is not None:
        raise click.BadParameter(printable(problem), param_hint="--model")
    make_data_dir(config)
    path = state_path(config.data_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    st = _resume(path, planned)
    if all(p.status == DONE for p in st.runs):
        click.echo(f"study {name}: every run is done already; showing the results", err=True)
    progress = Progress("study")
    stopped = None
    try:
        completed = run_loop(_run_study(config, st, lambda: st.save(path), extra, progress))
    except Stop as exc:
        completed, stopped = True, printable(str(exc))
        click.echo(f"toolproxy study: {stopped}", err=True)
    if stopped is not None and not any(p.status != PENDING for p in st.runs):
        sys.exit(1)  # nothing ran: nothing to analyze or show
    finish(config.data_dir, st, interrupted=not completed, stopped=stopped is not None)


def finish(data_dir: Path, st: Study, interrupted: bool, stopped: bool = False) -> None:
    """Analyze, compare, print and keep the study's markdown beside its state; then the exit code:
    130 when interrupted, 1 when the study stopped early or no cell produced a model turn (nothing
    was measured of any model), else 0."""
    if toolproxy_cli("analyze", "--data", str(data_dir)).returncode != 0:
        raise click.ClickException(
            f"analyze failed on {data_dir}; run `toolproxy analyze --data {data_dir}` to see why"
        )
    names = [p.run for p in st.runs if p.status not in (PENDING, NO_REQUESTS)]
    reports = _report_runs(data_dir, names) if names else {}
    comparisons: dict[str, dict | None] = {}
    firsts = {
        (p.stack, p.model, p.repeat): p.run for p in st.runs if p.condition == st.conditions[0] and p.status == DONE
    }
    for p in st.runs:
        first = firsts.get((p.stack, p.model, p.repeat))
        if p.condition != st.conditions[0] and p.status == DONE and first is not None:
            comparisons[p.run] = _compare(data_dir, first, p.run)
    html = None
    if names:
        html = data_dir / STUDY_DIR / f"{st.name}.html"
        args = ["report", "--data", str(data_dir), "--format", "html", "-o", str(html)]
        for r in names:
            args += ["--run", r]
        if toolproxy_cli(*args).returncode != 0:
            html = None
    text = render(st, reports, comparisons, html)
    if names:
        tables = toolproxy_cli("report", "--data", str(data_dir), "--study", st.name, "--format", "markdown")
        heat = data_dir / STUDY_DIR / f"{st.name}-tables.html"
        if tables.returncode == 0:
            text += "\n" + tables.stdout
        if (
            toolproxy_cli(
                "report", "--data", str(data_dir), "--study", st.name, "--format", "html", "-o", str(heat)
            ).returncode
            == 0
        ):
            text += f"\nTables as a heat map: {heat}\n"
    (data_dir / STUDY_DIR / f"{st.name}.md").write_text(text)
    click.echo(printable(text, lines=True), nl=False)
    if interrupted:
        click.echo(f"study {st.name}: interrupted; run the same command again to resume", err=True)
        sys.exit(130)
    if stopped:
        sys.exit(1)
    done = [p.run for p in st.runs if p.status == DONE]
    if not any(_model_turns(reports.get(run)) for run in done):
        click.echo(f"study {st.name}: {_nothing_measured(st, reports)}", err=True)
        sys.exit(1)


def _model_turns(report: dict | None) -> int:
    """Turns of a run that got the model's output (every turn that is not a non-response)."""
    if not report:
        return 0
    return int(report.get("turns") or 0) - sum((report.get("non_response_kinds") or {}).values())


def _nothing_measured(st: Study, reports: dict[str, dict]) -> str:
    """Why no cell produced a model turn, from what the cells recorded."""
    ran = [p for p in st.runs if p.status != PENDING]
    if ran and all(p.status == NO_REQUESTS for p in ran):
        return "no cell's harness sent the proxy a request: nothing was measured"
    if not any(p.status == DONE for p in st.runs):
        return "no cell ran to its end, so nothing was measured"
    causes = "; ".join(
        sorted({from_report(reports[p.run]).cause() for p in st.runs if p.status == DONE and p.run in reports} - {""})
    )
    return "no cell produced a model turn: nothing was measured of the model" + (
        f" (every turn a non-response: {causes})" if causes else " (no turn was recorded)"
    )
