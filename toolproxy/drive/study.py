"""`toolproxy study`: the same harness once per interface condition, then the paired answer.

One in-process proxy serves the whole study; each (condition, repeat) is a run named
NAME-COND[-k] whose requests carry that condition as a tag, so the stack, model and harness are
held fixed and only the interface changes. The study's state is a small JSON file in the data
directory, written after every run: Ctrl-C leaves the finished runs usable, and running the same
command again skips them. A run cut short is kept under its own name (marked interrupted) and
redone under a fresh one, so a partial run's turns never mix with a complete one's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from toolproxy.analysis.measure.runline import from_report
from toolproxy.conditions import NAMES
from toolproxy.drive.harness import harness_env, tag_prefix
from toolproxy.drive.run import _parse_tags, _run_child, proxy_address_line, run_loop, start_proxy, toolproxy_cli
from toolproxy.proxy.cli import config_from_options, harness_serve_options, make_data_dir
from toolproxy.proxy.config import ProxyConfig
from toolproxy.term.printable import printable
from toolproxy.term.progress import Progress, duration

STUDY_DIR = "studies"


@dataclass
class Planned:
    condition: str
    repeat: int  # 1-based
    run: str  # the run name the finished attempt was recorded under
    status: str = "pending"  # pending | done | failed | interrupted
    exit_code: int | None = None
    seconds: float | None = None
    attempts: list[str] = field(default_factory=list)  # earlier run names of cut-short attempts


@dataclass
class Study:
    name: str
    command: list[str]
    upstream: str
    conditions: list[str]
    repeat: int
    runs: list[Planned]

    @classmethod
    def plan(cls, name: str, command: list[str], upstream: str, conditions: list[str], repeat: int) -> "Study":
        runs = [Planned(c, k, run_name(name, c, k, repeat)) for k in range(1, repeat + 1) for c in conditions]
        return cls(name, command, upstream, conditions, repeat, runs)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "Study":
        doc = json.loads(path.read_text())
        return cls(**{**doc, "runs": [Planned(**r) for r in doc["runs"]]})


def run_name(name: str, condition: str, repeat: int, repeats: int) -> str:
    return f"{name}-{condition}" + (f"-{repeat}" if repeats > 1 else "")


def state_path(data_dir: Path, name: str) -> Path:
    return data_dir / STUDY_DIR / f"{name}.json"


def _resume(path: Path, fresh: Study) -> Study:
    """The saved study if it is the same study; a changed command or plan is a usage error."""
    if not path.exists():
        return fresh
    try:
        saved = Study.load(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise click.ClickException(f"{path} is not a readable study state ({exc}); move it away to start over") from None
    if (saved.command, saved.conditions, saved.repeat) != (fresh.command, fresh.conditions, fresh.repeat):
        raise click.UsageError(
            f"a study named {fresh.name!r} with another command or plan exists in {path}; "
            "choose another --name, or move that file away to start over")
    return saved


def _eta(done: list[float], left: int) -> str:
    if not done or not left:
        return ""
    secs = sorted(done)[len(done) // 2] * left
    return f", about {duration(secs)} left"


def run_line(run: str, exchanges: int, elapsed: float, done: list[float], runs_after: int) -> str:
    """The progress line while one run's harness works: its exchanges so far and their rate, and
    the study's time left, from the median duration of the runs done (once there is one)."""
    rate = exchanges / elapsed * 60 if elapsed > 0 else 0.0
    text = f"  {run}: {exchanges} exchanges in {duration(elapsed)} ({rate:,.1f}/min)"
    if done:
        typical = sorted(done)[len(done) // 2]
        text += f", study about {duration(max(typical - elapsed, 0.0) + typical * runs_after)} left"
    return text


async def _run_study(config: ProxyConfig, study: Study, save, tags: dict[str, str], progress: Progress) -> bool:
    """Every pending run in order; False when the user interrupted (the rest stays pending)."""
    proxy = await start_proxy(config)
    click.echo(proxy_address_line("study", proxy, config), err=True)
    state = proxy.state
    todo = [p for p in study.runs if p.status != "done"]
    durations = [p.seconds for p in study.runs if p.status == "done" and p.seconds]
    try:
        for i, planned in enumerate(todo, 1):
            if planned.status in ("interrupted", "failed"):
                planned.attempts.append(planned.run)
                planned.run = f"{run_name(study.name, planned.condition, planned.repeat, study.repeat)}~{len(planned.attempts) + 1}"
            label = f"[{i}/{len(todo)}] {planned.run} (condition {planned.condition})"
            click.echo(f"study {study.name}: {label}{_eta(durations, len(todo) - i + 1)}", err=True)
            base = proxy.url + tag_prefix(planned.run, planned.condition, **tags)
            env = {**os.environ, **harness_env(base, os.environ)}
            start, seen = time.monotonic(), state.counters.total
            child = asyncio.ensure_future(_run_child(study.command, env))
            while not child.done():
                await asyncio.wait([child], timeout=1.0)
                progress.show(run_line(planned.run, state.counters.total - seen, time.monotonic() - start,
                                       durations, len(todo) - i))
            progress.clear()
            result = child.result()
            planned.seconds = round(time.monotonic() - start, 1)
            planned.exit_code = result.returncode
            planned.status = "interrupted" if result.interrupted else ("done" if result.returncode == 0 else "failed")
            save()
            if result.interrupted:
                return False
            if planned.status == "failed":
                click.echo(f"  {planned.run}: the harness exited {result.returncode}; its turns are kept and "
                           "analyzed, and a rerun of this command tries it again", err=True)
            durations.append(planned.seconds)
        return True
    finally:
        await proxy.stop()


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
    """The study as markdown: what ran, per run the two fidelities, and each condition against the first."""
    lines = [f"# Study {study.name}", "",
             f"Command: `{' '.join(study.command)}`  ", f"Upstream: {study.upstream}  ",
             f"Conditions: {', '.join(study.conditions)}; repeats: {study.repeat}", "",
             "| run | condition | status | episodes | call fidelity [95% CI] | delivered fidelity [95% CI] | non-responses |",
             "|---|---|---|---|---|---|---|"]
    for p in study.runs:
        r = reports.get(p.run)
        if r is None:
            lines.append(f"| {p.run} | {p.condition} | {p.status} | 0 | - | - | - |")
            continue
        cells = from_report(r).cells()
        lines.append(f"| {p.run} | {p.condition} | {p.status} | {r.get('episodes', 0)} | {cells['call']} | "
                     f"{cells['delivered']} | {cells['cause'] or 'none'} |")
    if comparisons:
        lines += ["", f"Paired against {study.conditions[0]} over the same items (exact McNemar; "
                  "A = the first condition, B = the other):", "",
                  "| B | metric | paired items | A only | B only | p |", "|---|---|---|---|---|---|"]
        for b, c in comparisons.items():
            if c is None:
                lines.append(f"| {b} | - | no items in common | - | - | - |")
                continue
            o = c["overall"]
            lines.append(f"| {b} | {c['metric']} | {o['paired']} | {o['a_only']} | {o['b_only']} | {o['p']:.4g} |")
    if html is not None:
        lines += ["", f"HTML report: {html}"]
    return "\n".join(lines) + "\n"


@click.command(context_settings={"allow_interspersed_args": False})
@harness_serve_options
@click.option("--conditions", default="native,hint,text,constrained", show_default=True,
              help="Comma-separated conditions, the first is the baseline of the paired tests.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 100), help="Runs per condition.")
@click.option("--name", default="study", show_default=True, help="Study name; runs are NAME-COND[-k].")
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", help="Extra tag on every request (repeatable).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def study(conditions, repeat, name, tags, command, **options):
    """Run a harness once per interface condition and compare: toolproxy study --upstream URL -- CMD ARGS...

    Each run is NAME-COND[-k] in the data directory. Ctrl-C keeps the finished runs; running the
    same command again resumes. At the end: per condition call and delivered fidelity with 95%
    intervals, non-responses by kind, and a paired McNemar test of each condition against the first.
    """
    wanted = [c.strip() for c in conditions.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in NAMES]
    if unknown or not wanted or len(set(wanted)) != len(wanted):
        raise click.BadParameter(f"give distinct conditions from {', '.join(NAMES)} (got {conditions!r})",
                                 param_hint="--conditions")
    if "/" in name or not name:
        raise click.BadParameter("a study name may not contain '/'", param_hint="--name")
    options["quiet"] = True
    config = config_from_options(**options)
    make_data_dir(config)
    extra = _parse_tags(tags)
    path = state_path(config.data_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    st = _resume(path, Study.plan(name, list(command), config.upstream, wanted, repeat))
    if all(p.status == "done" for p in st.runs):
        click.echo(f"study {name}: every run is done already; showing the results", err=True)
    progress = Progress("study")
    completed = run_loop(_run_study(config, st, lambda: st.save(path), extra, progress))
    finish(config.data_dir, st, interrupted=not completed)


def finish(data_dir: Path, st: Study, interrupted: bool) -> None:
    """Analyze, compare, print and keep the study's markdown beside its state."""
    if toolproxy_cli("analyze", "--data", str(data_dir)).returncode != 0:
        raise click.ClickException(f"analyze failed on {data_dir}; run `toolproxy analyze --data {data_dir}` to see why")
    names = [p.run for p in st.runs if p.status != "pending"]
    reports = _report_runs(data_dir, names) if names else {}
    comparisons: dict[str, dict | None] = {}
    firsts = {p.repeat: p.run for p in st.runs if p.condition == st.conditions[0] and p.status == "done"}
    for p in st.runs:
        if p.condition != st.conditions[0] and p.status == "done" and p.repeat in firsts:
            comparisons[p.run] = _compare(data_dir, firsts[p.repeat], p.run)
    html = None
    if names:
        html = data_dir / STUDY_DIR / f"{st.name}.html"
        args = ["report", "--data", str(data_dir), "--format", "html", "-o", str(html)]
        for r in names:
            args += ["--run", r]
        if toolproxy_cli(*args).returncode != 0:
            html = None
    text = render(st, reports, comparisons, html)
    (data_dir / STUDY_DIR / f"{st.name}.md").write_text(text)
    click.echo(printable(text, lines=True), nl=False)
    if interrupted:
        click.echo(f"study {st.name}: interrupted; run the same command again to resume", err=True)
        sys.exit(130)
