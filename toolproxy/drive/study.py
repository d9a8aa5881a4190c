"""`toolproxy study`: the same harness across stacks, models and interface conditions, then the tables.

A study is a matrix: every upstream (`--upstream NAME=URL`, repeatable) crossed with every model
(`--model`, repeatable), every condition and every repeat. Each cell is a run named
NAME[-STACK][-MODEL]-COND[-k] whose requests carry its condition, and its model as an
`upstream_model` tag the proxy puts in the request (toolproxy/proxy/modelswap.py), so the harness
is the same unmodified command in every cell and only the stack, the model or the interface
changes. One in-process proxy per upstream serves the study, so each upstream is fingerprinted
once and its runs are attributed to it.

The study's state is a small JSON file in the data directory, written after every run: Ctrl-C
leaves the finished runs usable, and running the same command again skips them. A run cut short
is kept under its own name (marked interrupted) and redone under a fresh one, so a partial run's
turns never mix with a complete one's.
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
from toolproxy.drive.run import proxy_address_line, run_child, run_child_relayed, start_proxy, toolproxy_cli
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


@dataclass
class Planned:
    condition: str
    repeat: int  # 1-based
    run: str  # the run name the finished attempt was recorded under
    status: str = "pending"  # pending | done | failed | interrupted
    exit_code: int | None = None
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

    def plan_key(self) -> tuple:
        return self.command, self.conditions, self.repeat, self.urls(), self.models

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Study:
        doc = json.loads(path.read_text())
        return cls(**{**doc, "runs": [Planned(**r) for r in doc["runs"]]})


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
    """The saved study if it is the same study; a changed command or plan is a usage error."""
    if not path.exists():
        return fresh
    try:
        saved = Study.load(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise click.ClickException(
            f"{path} is not a readable study state ({exc}); move it away to start over"
        ) from None
    if saved.plan_key() != fresh.plan_key():
        raise click.UsageError(
            f"a study named {fresh.name!r} with another command or plan exists in {path}; "
            "choose another --name, or move that file away to start over"
        )
    return saved


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


async def _run_study(config: ProxyConfig, study: Study, save, tags: dict[str, str], progress: Progress) -> bool:
    """Every pending run in order; False when the user interrupted (the rest stays pending)."""
    urls = study.urls()
    proxies = {}
    try:
        for stack in {p.stack for p in study.runs if p.status != "done"}:
            stack_config = dataclasses.replace(config, upstream=urls[stack])
            proxies[stack] = await start_proxy(stack_config)
            click.echo(proxy_address_line("study", proxies[stack], stack_config), err=True)
        return await _run_cells(study, proxies, save, tags, progress)
    finally:
        for proxy in proxies.values():
            await proxy.stop()


async def _run_cells(study: Study, proxies: dict, save, tags: dict[str, str], progress: Progress) -> bool:
    todo = [p for p in study.runs if p.status != "done"]
    durations = [p.seconds for p in study.runs if p.status == "done" and p.seconds]
    finished = len(study.runs) - len(todo)
    relay = HarnessOutput(progress) if progress.enabled else None
    for i, planned in enumerate(todo, 1):
        if planned.status in ("interrupted", "failed"):
            planned.attempts.append(planned.run)
            base_name = run_name(
                study.name, planned.condition, planned.repeat, study.repeat, planned.stack, planned.model
            )
            planned.run = f"{base_name}~{len(planned.attempts) + 1}"
        click.echo(cell_line(study.name, planned, len(study.runs), finished, durations, len(todo) - i + 1), err=True)
        proxy = proxies[planned.stack]
        base = proxy.url + cell_prefix(planned, tags)
        env = {**os.environ, **harness_env(base, os.environ)}
        start, seen = time.monotonic(), proxy.state.counters.total
        if relay is not None:
            env.setdefault("PYTHONUNBUFFERED", "1")  # its output piped through here, as it comes
            child = asyncio.ensure_future(run_child_relayed(study.command, env, relay))
        else:
            child = asyncio.ensure_future(run_child(study.command, env))
        while not child.done():
            await asyncio.wait([child], timeout=1.0)
            if relay is not None:
                relay.show(
                    run_line(
                        planned.run,
                        proxy.state.counters.total - seen,
                        time.monotonic() - start,
                        durations,
                        len(todo) - i,
                    )
                )
        progress.clear()
        result = child.result()
        planned.seconds = round(time.monotonic() - start, 1)
        planned.exit_code = result.returncode
        planned.status = "interrupted" if result.interrupted else ("done" if result.returncode == 0 else "failed")
        save()
        if result.interrupted:
            return False
        if planned.status == "failed":
            click.echo(
                f"  {planned.run}: the harness exited {result.returncode}; its turns are kept and "
                "analyzed, and a rerun of this command tries it again",
                err=True,
            )
        durations.append(planned.seconds)
        finished += 1
    return True


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
            lines.append(f"{head}{p.status} | 0 | - | - | - |")
            continue
        cells = from_report(r).cells()
        lines.append(
            f"{head}{p.status} | {r.get('episodes', 0)} | {cells['call']} | "
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


def _several_upstreams(fn):
    """serve's --upstream, repeatable and optionally named, for a study across stacks."""
    fn.__click_params__ = [p for p in fn.__click_params__ if p.name != "upstream"]
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
    options["quiet"] = True
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
    if all(p.status == "done" for p in st.runs):
        click.echo(f"study {name}: every run is done already; showing the results", err=True)
    progress = Progress("study")
    completed = run_loop(_run_study(config, st, lambda: st.save(path), extra, progress))
    finish(config.data_dir, st, interrupted=not completed)


def finish(data_dir: Path, st: Study, interrupted: bool) -> None:
    """Analyze, compare, print and keep the study's markdown beside its state."""
    if toolproxy_cli("analyze", "--data", str(data_dir)).returncode != 0:
        raise click.ClickException(
            f"analyze failed on {data_dir}; run `toolproxy analyze --data {data_dir}` to see why"
        )
    names = [p.run for p in st.runs if p.status != "pending"]
    reports = _report_runs(data_dir, names) if names else {}
    comparisons: dict[str, dict | None] = {}
    firsts = {
        (p.stack, p.model, p.repeat): p.run for p in st.runs if p.condition == st.conditions[0] and p.status == "done"
    }
    for p in st.runs:
        first = firsts.get((p.stack, p.model, p.repeat))
        if p.condition != st.conditions[0] and p.status == "done" and first is not None:
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
