"""`toolproxy conformance`: every case N times under every condition, gated, as a diffable matrix.

Each request goes through the in-process proxy tagged `run=conformance-<condition>/condition=...
/item=<case>/episode=<i>`, so conditions apply exactly as for a harness and the analyzer can read
the runs afterwards. A run that got no upstream answer (connect, timeout, cut) or that the
condition did not apply to is *not measured*: shown as such, never counted as a failed case.

A gate passes when passes/runs >= min_pass_rate. With unmeasured runs it is decided only when the
unmeasured runs cannot change the outcome (even all passing would not reach the threshold: fail;
already reached: pass); otherwise it is "unknown", which for the primary condition means exit 2.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import click
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolproxy import __version__
from toolproxy.checks.cases import BY_NAME, CASES, Case
from toolproxy.checks.local import ProbeExchange, check_target, local_proxy
from toolproxy.conditions import NAMES
from toolproxy.conditions import load as load_condition
from toolproxy.proxy.cli import key_from_env, upstream_key_option
from toolproxy.stacks.fingerprint import Fingerprint
from toolproxy.term.connection_errors import with_detail
from toolproxy.term.printable import printable
from toolproxy.term.progress import Progress, duration


class GatesError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Gate:
    level: str
    min_pass_rate: float


def default_gates() -> dict[str, Gate]:
    raw = orjson.loads(resources.files("toolproxy.checks").joinpath("gates.json").read_bytes())
    return parse_gates(raw)


class GateEntry(BaseModel):
    """One entry of a gates file, as a user writes it: either field may be left to the base gates."""

    model_config = ConfigDict(extra="forbid", strict=True)
    level: Literal["hard", "advisory"] | None = None
    min_pass_rate: float | None = Field(default=None, ge=0, le=1)


def _entry_problem(name: str, error: dict) -> str:
    """One pydantic error about a gates entry, said for the person who wrote the file."""
    field_name = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{name}: unknown field {field_name!r}; a gate has level and min_pass_rate"
    if not field_name:
        return f"{name}: expected an object with level and/or min_pass_rate (got {error['input']!r})"
    return f"{name}.{field_name}: {error['msg']} (got {error['input']!r})"


def parse_gates(raw: Any, base: dict[str, Gate] | None = None) -> dict[str, Gate]:
    """Gates from a JSON object, each entry optionally partial over `base`; errors name the entry.

    Entries are checked by GateEntry (pydantic), so a misspelt field is an error rather than a
    gate silently left at its default. Keys starting with `_` are comments.
    """
    if not isinstance(raw, dict):
        raise GatesError("a gates file is a JSON object: {case: {level, min_pass_rate}}")
    gates = dict(base or {})
    problems = []
    for name, spec in raw.items():
        if name.startswith("_"):
            continue
        if name not in BY_NAME:
            problems.append(f"unknown case {name!r}; cases are {', '.join(BY_NAME)}")
            continue
        try:
            entry = GateEntry.model_validate(spec)
        except ValidationError as exc:
            problems += [_entry_problem(name, e) for e in exc.errors()]
            continue
        old = gates.get(name)
        level = entry.level or (old.level if old else None)
        rate = entry.min_pass_rate if entry.min_pass_rate is not None else (old.min_pass_rate if old else None)
        if level is None or rate is None:
            problems.append(f"{name}: give both level and min_pass_rate (there is no default gate to complete)")
            continue
        gates[name] = Gate(level, rate)
    missing = [c.name for c in CASES if c.name not in gates]
    if missing and not problems:
        problems.append(f"no gate for {', '.join(missing)}")
    if problems:
        raise GatesError("; ".join(problems))
    return gates


@dataclass(slots=True)
class Cell:
    """One case under one condition: how its runs went."""

    runs: int = 0
    passes: int = 0
    refused: int = 0  # HTTP error from the serving layer: a measured failure
    transport: int = 0  # no upstream answer: not measured
    skipped: int = 0  # the condition did not apply: not measured
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def unmeasured(self) -> int:
        return self.transport + self.skipped

    def add(self, probe: ProbeExchange, case: Case) -> None:
        self.runs += 1
        reply = probe.reply
        if reply.transport_failed:
            self.transport += 1
            return
        if probe.condition_skipped:
            self.skipped += 1
            return
        if reply.refused:
            self.refused += 1
            why = f"HTTP {reply.status}: {reply.error_text[:120]}"
            passed = False
        else:
            passed, why = case.check(reply, case.tools)
        if passed:
            self.passes += 1
        else:
            self.reasons[why] = self.reasons.get(why, 0) + 1


def decide(cell: Cell, gate: Gate) -> str:
    """pass | fail | unknown (unmeasured runs could still change the outcome)."""
    if cell.runs == 0:
        return "unknown"
    best = (cell.passes + cell.unmeasured) / cell.runs
    worst = cell.passes / cell.runs
    if best < gate.min_pass_rate:
        return "fail"
    if worst >= gate.min_pass_rate:
        return "pass"
    return "unknown"


def condition_status(cells: dict[str, Cell], gates: dict[str, Gate]) -> str:
    """pass | fail | unknown over the hard gates of one condition."""
    outcomes = [decide(cells[name], g) for name, g in gates.items() if g.level == "hard" and name in cells]
    if "fail" in outcomes:
        return "fail"
    return "unknown" if "unknown" in outcomes or not outcomes else "pass"


def _cell_text(cell: Cell, gate: Gate) -> str:
    if cell.runs == 0:
        return "n/a"
    measured = cell.runs - cell.unmeasured
    if measured == 0:
        return f"transport x{cell.transport}" if cell.transport else f"skipped x{cell.skipped}"
    text = f"{cell.passes}/{cell.runs}"
    notes = [
        f"{n} {what}"
        for n, what in ((cell.refused, "refused"), (cell.transport, "transport"), (cell.skipped, "skipped"))
        if n
    ]
    if notes:
        text += f" ({', '.join(notes)})"
    mark = {"pass": "", "fail": " ✗", "unknown": " ?"}[decide(cell, gate)]
    return text + mark


@dataclass(slots=True)
class ConformanceResult:
    upstream: str
    model: str
    fingerprint: dict[str, Any]
    runs: int
    conditions: list[str]
    primary: str
    gates: dict[str, Gate]
    cells: dict[str, dict[str, Cell]]  # condition -> case -> cell
    started: str
    problem: str | None = None
    problem_detail: str | None = None  # the system's own text behind it (errno and all)

    def status(self, condition: str) -> str:
        return condition_status(self.cells.get(condition, {}), self.gates)

    @property
    def passing(self) -> list[str]:
        return [c for c in self.conditions if self.status(c) == "pass"]

    @property
    def exit_code(self) -> int:
        if self.problem:
            return 2
        return {"pass": 0, "fail": 1, "unknown": 2}[self.status(self.primary)]


def render_markdown(res: ConformanceResult) -> str:
    fp = Fingerprint(**res.fingerprint)
    lines = [
        f"# Conformance: {res.model} on {fp.label}",
        "",
        f"- upstream: {res.upstream}; stack {fp.stack}"
        + (f", build {fp.build}" if fp.build else "")
        + f"; toolproxy {__version__}",
        f"- {res.runs} runs per case and condition; started {res.started}; primary condition: {res.primary}",
        "- a cell is passes/runs; ✗ misses its gate, ? cannot be decided (runs without an upstream answer); "
        "refused = the serving layer answered an HTTP error (counted as failed), transport/skipped = not measured",
        "",
        "| case | gate | " + " | ".join(res.conditions) + " |",
        "|---|---|" + "---|" * len(res.conditions),
    ]
    for case in CASES:
        g = res.gates[case.name]
        gate = f"{g.level} ≥{g.min_pass_rate:.0%}"
        cells = [_cell_text(res.cells[c][case.name], g) for c in res.conditions]
        lines.append(f"| {case.name} | {gate} | " + " | ".join(cells) + " |")
    verdicts = {"pass": "pass", "fail": "**FAIL**", "unknown": "unknown"}
    lines.append("| **hard gates** | | " + " | ".join(verdicts[res.status(c)] for c in res.conditions) + " |")
    lines += ["", summary_line(res)]
    failing = _failure_notes(res)
    if failing:
        lines += ["", "Why runs failed (most common reason per cell):", ""] + failing
    return "\n".join(lines) + "\n"


def summary_line(res: ConformanceResult) -> str:
    passing = res.passing
    status = res.status(res.primary)
    head = {
        "pass": f"{res.primary} passes every hard gate",
        "fail": f"hard gate failed under {res.primary}",
        "unknown": f"{res.primary} could not be judged (runs without an upstream answer)",
    }[status]
    tail = (
        f"conditions passing every hard gate: {', '.join(passing)}"
        if passing
        else "no condition passes every hard gate"
    )
    return f"Result: {head}; {tail}."


def _failure_notes(res: ConformanceResult) -> list[str]:
    """The most common reason per failing cell; one line when every case failed for the same one."""
    out = []
    for c in res.conditions:
        by_reason: dict[str, list[tuple[str, int]]] = {}
        for case in CASES:
            cell = res.cells[c][case.name]
            if cell.reasons:
                why, n = max(cell.reasons.items(), key=lambda kv: kv[1])
                by_reason.setdefault(why, []).append((case.name, n))
        for why, items in by_reason.items():
            if len(items) == len(CASES):
                out.append(f"- {c} / every case: {why} (x{sum(n for _, n in items)})")
            else:
                out += [f"- {c} / {name}: {why} (x{n})" for name, n in items]
    return out


def _body(case: Case, model: str, temperature: float, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": case.messages,
        "tools": case.tools,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "stream": False,
    }


async def run_conformance(
    upstream: str,
    model: str,
    conditions: list[str],
    primary: str,
    runs: int,
    gates: dict[str, Gate],
    data_dir: Path,
    *,
    upstream_key: str | None = None,
    stack: str | None = None,
    temperature: float = 0.0,
    max_tokens: int = 256,
    concurrency: int = 1,
    timeout: float = 300.0,
    progress=None,
) -> ConformanceResult:
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cells = {c: {case.name: Cell() for case in CASES} for c in conditions}
    async with local_proxy(
        upstream, data_dir, "conformance", upstream_key=upstream_key, stack=stack, timeout=timeout
    ) as lp:
        fp = await lp.fingerprint(model)
        res = ConformanceResult(upstream, model, fp.to_dict(), runs, conditions, primary, gates, cells, started)
        res.fingerprint.pop("chat_template", None)
        if fp.stack == "unreachable":
            res.problem, res.problem_detail = fp.error, fp.error_detail
            return res
        limit = asyncio.Semaphore(concurrency)

        async def one(cond: str, case: Case, i: int) -> None:
            async with limit:
                probe = await lp.post(
                    "/v1/chat/completions",
                    _body(case, model, temperature, max_tokens),
                    run=f"conformance-{cond}",
                    condition=cond,
                    item=case.name,
                    episode=str(i),
                )
            cells[cond][case.name].add(probe, case)
            if progress is not None:
                progress(cond, case.name, i, probe)

        for cond in conditions:
            # Case-major: repeats of one request follow each other, so a stack's prompt cache can
            # serve them (as it would a harness's retries) instead of being evicted every request.
            await asyncio.gather(*(one(cond, case, i) for case in CASES for i in range(1, runs + 1)))
            if all(cell.transport == cell.runs for cell in cells[cond].values()):
                res.problem = f"no request under {cond} got an upstream answer: is {upstream} still up?"
                break
        return res


REPORT_DIR = "conformance"


def report_path(data_dir: Path, model: str, when: datetime.date | None = None) -> Path:
    """Where the matrix is kept by default: beside the recordings it was made from (DATA/conformance/),
    never in the current directory, which the user did not offer."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-") or "model"
    return data_dir / REPORT_DIR / f"{(when or datetime.date.today()).isoformat()}-conformance-{slug}.md"


class Pace:
    """The progress line, and once the first answer is in, one line saying how long all will take
    at its pace: on a CPU model a run of the cases takes minutes, and that is worth knowing at
    once, on a terminal or in a log."""

    def __init__(self, bar: Progress, total: int, concurrency: int, quiet: bool) -> None:
        self.bar, self.total, self.concurrency, self.quiet = bar, total, concurrency, quiet
        self.told = False

    def __call__(self, condition: str, case: str, i: int, probe: ProbeExchange) -> None:
        self.bar.advance()
        if self.told or self.quiet:
            return
        self.told = True
        each = probe.elapsed_s / self.concurrency
        self.bar.clear()
        click.echo(
            f"toolproxy conformance: the first answer took {probe.elapsed_s:.1f}s; at that pace all "
            f"{self.total} requests take about {duration(each * self.total)} (--runs sets the runs per case)",
            err=True,
        )


def _conditions(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    for n in names:
        if n not in NAMES:
            raise click.BadParameter(f"unknown condition {n!r}; choose from {', '.join(NAMES)}")
        if n != "native":
            try:
                load_condition(n)
            except (ValueError, ImportError) as exc:
                raise click.BadParameter(f"condition {n!r} is not available: {exc}") from None
    if not names or len(set(names)) != len(names):
        raise click.BadParameter("give each condition once, comma-separated, e.g. native,hint,text")
    return names


@click.command()
@click.option("--upstream", required=True, help="Model server root URL.")
@click.option("--model", required=True, help="Model name as the server knows it.")
@click.option(
    "--runs",
    default=3,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Runs per case and condition (gates are pass rates: 20 or more to gate a release).",
)
@click.option(
    "--conditions",
    "conditions_arg",
    default="native",
    show_default=True,
    help="Comma-separated conditions, e.g. native,hint,text,constrained.",
)
@click.option(
    "--gate-on",
    default="native",
    show_default=True,
    help="The primary condition: its hard gates decide the exit status.",
)
@click.option(
    "--gates",
    "gates_file",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="JSON file overriding the default gates (toolproxy/checks/gates.json).",
)
@click.option(
    "-o",
    "--output",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Markdown file to write (default: DATA/conformance/DATE-conformance-MODEL.md).",
)
@upstream_key_option
@click.option(
    "--stack",
    default=None,
    help="The serving stack the constrained condition writes its schema for when fingerprinting cannot tell.",
)
@click.option(
    "--data",
    "data_dir",
    default="toolproxy-data",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the requests are recorded (runs conformance-<condition>).",
)
@click.option(
    "--temperature", default=0.0, show_default=True, type=float, help="Sampling temperature for every request."
)
@click.option("--max-tokens", default=256, show_default=True, type=int, help="max_tokens for every request.")
@click.option(
    "--concurrency", default=1, show_default=True, type=click.IntRange(1, 64), help="Requests in flight at once."
)
@click.option("--timeout", default=300.0, show_default=True, type=float, help="Seconds to wait for one response.")
@click.option("--quiet", is_flag=True, help="No progress line on stderr (it is only drawn on a terminal anyway).")
def conformance(
    upstream,
    model,
    runs,
    conditions_arg,
    gate_on,
    gates_file,
    output,
    upstream_key_env,
    stack,
    data_dir,
    temperature,
    max_tokens,
    concurrency,
    timeout,
    quiet,
):
    """Run the conformance cases N times per condition and gate the primary one.

    Exit status: 0 the primary condition passes every hard gate, 1 it fails one, 2 usage or
    transport error (the endpoint being down is not a model failure).
    """
    conditions = _conditions(conditions_arg)
    if gate_on not in conditions:
        raise click.UsageError(f"--gate-on {gate_on!r} must be one of --conditions ({', '.join(conditions)})")
    try:
        gates = default_gates()
        if gates_file is not None:
            gates = parse_gates(orjson.loads(gates_file.read_bytes()), gates)
    except (GatesError, orjson.JSONDecodeError) as exc:
        raise click.UsageError(f"--gates {gates_file}: {exc}") from None
    key = key_from_env(upstream_key_env, "--upstream-key-env")
    check_target(upstream, data_dir)

    total = len(conditions) * len(CASES) * runs
    if not quiet:
        click.echo(
            f"toolproxy conformance: {total} requests ({len(CASES)} cases x {runs} runs x "
            f"{len(conditions)} condition{'s' if len(conditions) != 1 else ''})",
            err=True,
        )
    with Progress("conformance", total, unit="requests", quiet=quiet) as bar:
        res = asyncio.run(
            run_conformance(
                upstream,
                model,
                conditions,
                gate_on,
                runs,
                gates,
                data_dir,
                upstream_key=key,
                stack=stack,
                temperature=temperature,
                max_tokens=max_tokens,
                concurrency=concurrency,
                timeout=timeout,
                progress=Pace(bar, total, concurrency, quiet),
            )
        )
    if res.problem and not any(cell.runs for cells in res.cells.values() for cell in cells.values()):
        click.echo(
            printable(with_detail(f"toolproxy conformance: {res.problem}", res.problem_detail), lines=True), err=True
        )
        sys.exit(2)
    report = printable(render_markdown(res), lines=True)
    path = output or report_path(data_dir, model)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report, encoding="utf-8")
    except OSError as exc:
        click.echo(f"toolproxy conformance: cannot write {path}: {exc.strerror or exc}", err=True)
        sys.exit(2)
    click.echo(report, nl=False)
    if res.problem:
        click.echo(
            printable(with_detail(f"toolproxy conformance: {res.problem}", res.problem_detail), lines=True), err=True
        )
    click.echo(f"written to {path}")
    sys.exit(res.exit_code)
