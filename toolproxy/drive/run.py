"""`toolproxy run -- CMD`: one harness process behind an in-process proxy, then its numbers.

The proxy listens on a free loopback port for exactly as long as the child runs; the child gets
the environment every common client reads (toolproxy.drive.harness), so it needs no change. The exit
code is the child's, so `toolproxy run` drops into scripts and CI in place of the bare command.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click
from yarl import URL

from toolproxy import wire
from toolproxy.drive.agents import AGENTS, AGENTS_DIR, DEFAULT_MODEL, CodingAgent, Pointing, agent_of
from toolproxy.drive.harness import harness_env
from toolproxy.playback.options import miss_line as _miss_line
from toolproxy.playback.options import playback_options
from toolproxy.proxy.cli import config_from_options, harness_serve_options, make_data_dir, tags_from_options
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.tags import tag_prefix
from toolproxy.runtime.eventloop import run_loop
from toolproxy.term.printable import printable

if TYPE_CHECKING:
    from toolproxy.proxy.server import RunningProxy


# A harness that exits without one request through the proxy: what to check, said at once.
NO_REQUEST = (
    "no request reached the proxy: the harness never used the address it was given "
    "(`toolproxy run --print-env` lists the variables it gets; a client may need its own)"
)


@dataclass
class ChildResult:
    returncode: int
    interrupted: bool
    exchanges: int | None = None  # requests that reached the proxy while it ran (None: not counted)


# Called with the signal's name when the user interrupts the harness, before the harness is sent it.
OnInterrupt = Callable[[str], None]


async def start_proxy(config: ProxyConfig) -> RunningProxy:
    """The proxy `serve` runs, on this loop (stop() flushes the records); a taken port is a usage error."""
    from toolproxy.proxy.server import CannotListen
    from toolproxy.proxy.server import start_proxy as start

    try:
        return await start(config)
    except CannotListen as exc:
        raise click.ClickException(str(exc)) from None


def proxy_address_line(command: str, proxy: RunningProxy, config: ProxyConfig) -> str:
    """Where the in-process proxy listens, said before the harness starts: its port is a free one
    picked at start, so without this line the live page cannot be found."""
    from toolproxy.proxy.admin import ADMIN_PREFIX

    text = f"toolproxy {command}: proxy on {proxy.url} -> upstream {printable(config.upstream)}"
    if config.live_page:
        text += f"; live page {proxy.url}{ADMIN_PREFIX}"
    return text


async def run_child(argv: list[str], env: dict[str, str], on_interrupt: OnInterrupt | None = None) -> ChildResult:
    """Run the harness; SIGINT/SIGTERM sent to us are passed on, and we wait for it to finish."""
    return await _supervise(await _spawn(argv, env), on_interrupt)


async def run_child_relayed(
    argv: list[str],
    env: dict[str, str],
    relay: Callable[[int, bytes], None],
    on_interrupt: OnInterrupt | None = None,
) -> ChildResult:
    """As run_child, with the harness's output read here and handed to `relay(fd, bytes)` as it
    comes (1: its stdout, 2: its stderr), so a caller that draws a progress line on the same
    terminal can keep the two apart."""
    proc = await _spawn(argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    async def pump(stream: asyncio.StreamReader, fd: int) -> None:
        while chunk := await stream.read(65536):
            relay(fd, chunk)

    pumps = [asyncio.ensure_future(pump(proc.stdout, 1)), asyncio.ensure_future(pump(proc.stderr, 2))]
    result = await _supervise(proc, on_interrupt)
    await asyncio.gather(*pumps)
    return result


async def _spawn(argv: list[str], env: dict[str, str], **streams) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(*argv, env=env, **streams)
    except FileNotFoundError:
        raise click.ClickException(f"{argv[0]}: command not found") from None
    except PermissionError:
        raise click.ClickException(f"{argv[0]}: permission denied (is it executable?)") from None


def _terminal_sent_it_too(pid: int) -> bool:
    """Whether a Ctrl-C reached the harness from the terminal as it reached us: the terminal sends
    SIGINT to its whole foreground process group, which the harness shares with us unless it left
    it. Passing the signal on as well interrupted it twice (a second KeyboardInterrupt raised
    while the first was being handled: two tracebacks)."""
    try:
        if os.getpgid(pid) != os.getpgrp():
            return False
    except OSError:
        return False
    for stream in (sys.stdin, sys.stderr, sys.stdout):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except (AttributeError, ValueError, OSError):
            continue
    return False


async def _supervise(proc: asyncio.subprocess.Process, on_interrupt: OnInterrupt | None = None) -> ChildResult:
    """Wait for the harness, passing SIGINT and SIGTERM on.

    The handlers are Python-level signal handlers, not the loop's: a Ctrl-C reaches the harness
    from the terminal at the same instant as us, and the harness may close its connections before
    the loop would get to a handler of its own, so the proxy would see a client that hung up, not
    an interrupt. A Python-level handler runs before the next Python code of this process, the
    proxy's handling of those closed connections included, so `on_interrupt` always comes first;
    the signal is then passed on from the loop."""
    loop = asyncio.get_running_loop()
    interrupted = False

    def forward(sig: int) -> None:
        if proc.returncode is None and not (sig == signal.SIGINT and _terminal_sent_it_too(proc.pid)):
            proc.send_signal(sig)

    def caught(sig: int, _frame) -> None:
        nonlocal interrupted
        interrupted = True
        if on_interrupt is not None:
            on_interrupt(signal.Signals(sig).name)
        loop.call_soon_threadsafe(forward, sig)

    before = {sig: signal.signal(sig, caught) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = await proc.wait()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return ChildResult(returncode=code if code >= 0 else 128 - code, interrupted=interrupted)


def interrupt_note(proxy: RunningProxy) -> OnInterrupt:
    """What `run` and `study` do on Ctrl-C before the harness gets the signal: tell their proxy,
    so an exchange the interrupt cuts is recorded as the user's (USER_INTERRUPT), not as a client
    that hung up on its own (which reads as a serving failure)."""

    def note(signal_name: str) -> None:
        proxy.state.user_interrupted(
            f"the user interrupted the harness ({signal_name}) while this exchange was in flight"
        )

    return note


async def unreachable_upstream(url: str) -> str | None:
    """Why the upstream does not answer, in words, or None (any HTTP answer will do)."""
    from toolproxy.proxy.upstreamhealth import check_upstream

    problem = await check_upstream(url)
    return None if problem is None else f"cannot reach the upstream {printable(url)}: {problem}"


async def run_harness(
    config: ProxyConfig,
    argv: list[str],
    tags: dict[str, str],
    agent: CodingAgent | None = None,
    model: str | None = None,
    mcp: McpOptions | None = None,
    check_upstream: bool = True,
) -> ChildResult:
    if check_upstream and (problem := await unreachable_upstream(config.upstream)) is not None:
        raise click.ClickException(f"{problem} The harness was not started.")
    proxy = await start_proxy(config)
    click.echo(proxy_address_line("run", proxy, config), err=True)
    wrapped = None
    try:
        base = proxy.url + tag_prefix(config.run, **tags)
        env = {**os.environ, **harness_env(base, os.environ)}
        if agent is not None:
            named = model or await upstream_model(config.upstream) or DEFAULT_MODEL
            folder = config.data_dir.resolve() / AGENTS_DIR / agent.name
            env.update(agent.apply(Pointing(base, named, folder, os.environ)))
            # the name may be the upstream's (/v1/models): its bytes are not for the terminal
            said = f"{agent.title} pointed at the proxy by {agent.reads} (model {printable(named)})"
            click.echo(f"toolproxy run: {said}", err=True)
        if mcp is not None and mcp.configs:
            wrapped = await _wrap_mcp(mcp, argv, config, tags)
            argv, env = wrapped.argv, {**env, **wrapped.env}
        result = await run_child(argv, env, interrupt_note(proxy))
        result.exchanges = proxy.state.counters.total + proxy.state.counters.in_flight
        return result
    finally:
        if wrapped is not None:
            await wrapped.stop()
        await proxy.stop()


async def upstream_model(upstream: str) -> str | None:
    """The first model the upstream lists at /v1/models (what a local stack serves), or None."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            async with session.get(upstream + "/v1/models") as resp:
                doc = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    return first.get("id") if isinstance(first.get("id"), str) and first["id"] else None


def bridge_gemini(config: ProxyConfig) -> None:
    """Gemini CLI speaks Gemini's protocol, which no local stack serves: bridged to chat unless the
    upstream is Google's own API."""
    host = URL(config.upstream).host or ""
    options = config.condition_options
    if not host.endswith("googleapis.com") and wire.GEMINI not in options.bridge:
        options.bridge = options.bridge | {wire.GEMINI}
        click.echo("toolproxy run: Gemini's protocol is bridged to chat completions for the upstream", err=True)


def no_request_line(agent: CodingAgent | None) -> str:
    """Said when the harness sent the proxy nothing: its traffic went elsewhere, or nowhere."""
    if agent is None:
        return f"toolproxy run: {NO_REQUEST}"
    return (
        f"toolproxy run: no request reached the proxy: {agent.title} never used the address it was given "
        f"(it was pointed at it by {agent.reads}; see docs/recipes for {agent.name})"
    )


@dataclass
class McpOptions:
    """`--mcp-config`: the agent's MCP configurations to wrap; under --playback, the run whose
    recorded servers answer, the playback server's address and what a miss does."""

    configs: list[Path]
    played: str | None = None
    playback_url: str | None = None
    on_miss: str = "fail"


async def _wrap_mcp(mcp: McpOptions, argv: list[str], config: ProxyConfig, tags: dict[str, str]):
    from toolproxy.drive.mcpconfig import McpConfigError, wrap_configs
    from toolproxy.proxy.server import CannotListen

    try:
        wrapped = await wrap_configs(
            mcp.configs,
            argv,
            config,
            tags,
            played=mcp.played,
            playback_url=mcp.playback_url,
            on_miss=mcp.on_miss,
        )
    except (McpConfigError, CannotListen) as exc:
        raise click.ClickException(str(exc)) from None
    for line in wrapped.lines:
        click.echo(f"toolproxy run: {printable(line)}", err=True)
    return wrapped


async def run_against_playback(
    options: dict,
    fixture,
    argv: list[str],
    tags: dict[str, str],
    agent: CodingAgent | None = None,
    model: str | None = None,
    mcp: McpOptions | None = None,
) -> ChildResult:
    """The harness behind the usual recording proxy, whose upstream is a playback server of the
    recorded run: the harness gets the recorded replies and its own traffic is recorded as a
    run of its own. The playback starts first, so the proxy's config names its address."""
    from toolproxy.playback.server import CannotPlay, start_playback

    recording, rules, playback_options = fixture
    try:
        playback = await start_playback(recording, rules, playback_options)
    except CannotPlay as exc:
        raise click.ClickException(str(exc)) from None
    try:
        config = config_from_options(**{**options, "upstream": playback.url})
        if agent is not None and agent.protocol == wire.GEMINI:
            bridge_gemini(config)
        if mcp is not None:
            mcp.played, mcp.playback_url, mcp.on_miss = playback_options.run, playback.url, playback_options.on_miss
        return await run_harness(config, argv, tags, agent, model, mcp, check_upstream=False)
    finally:
        await playback.stop()
        click.echo(f"toolproxy run: playback of {printable(playback_options.run)}: {playback.stats.line()}", err=True)


def toolproxy_cli(*args: str, capture: bool = True) -> subprocess.CompletedProcess:
    """Another toolproxy command in its own process (the analyzer loads DuckDB; the proxy must not)."""
    return subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", *args], text=True, capture_output=capture, stdin=subprocess.DEVNULL
    )


def analyze_and_summarise(data_dir: Path, runs: list[str]) -> list[dict]:
    """Analyze DATA, then the report's JSON objects for `runs` (empty when nothing was recorded)."""
    done = toolproxy_cli("analyze", "--data", str(data_dir))
    if done.returncode != 0:
        raise click.ClickException(f"analyze failed: {done.stderr.strip() or done.stdout.strip()}")
    args = ["report", "--data", str(data_dir), "--format", "json"]
    for r in runs:
        args += ["--run", r]
    rep = toolproxy_cli(*args)
    if rep.returncode != 0:
        return []
    return json.loads(rep.stdout).get("runs", [])


def one_line(run: dict) -> str:
    """The run's numbers in one line, as the report reads them (analysis.measure.runline)."""
    from toolproxy.analysis.measure.runline import from_report

    return from_report(run).text()


def provenance_lines(run: dict) -> list[str]:
    """What produced the run's number (served model, stack, parser, template, sampling) and the
    "why this number" line, from its report JSON, so the number `run` prints never stands without
    its origin."""
    from toolproxy.analysis.report.provenance import Provenance

    origin = run.get("provenance")
    return Provenance.from_dict(origin).lines(bold="") if origin else []


def write_html_report(data_dir: Path, runs: list[str], out: Path) -> Path | None:
    out.parent.mkdir(parents=True, exist_ok=True)
    args = ["report", "--data", str(data_dir), "--format", "html", "-o", str(out)]
    for r in runs:
        args += ["--run", r]
    return out if toolproxy_cli(*args).returncode == 0 else None


def _upstream_optional(fn):
    """With --playback the upstream is the recording: --upstream is only where misses go."""
    for param in fn.__click_params__:
        if param.name == "upstream":
            param.required = False
    return fn


@click.command(context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False})
@_upstream_optional
@harness_serve_options
@click.option(
    "--playback",
    "playback_run",
    default=None,
    metavar="RUN",
    help="Answer the harness from this recorded run (in --data) instead of a model server: an offline, "
    "deterministic agent test; its traffic is recorded as RUN@playback (or --run).",
)
@playback_options
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra tag on every request (repeatable), e.g. category=simple.",
)
@click.option(
    "--agent",
    "agent_name",
    type=click.Choice(["auto", "none", *AGENTS]),
    default="auto",
    show_default=True,
    help="The coding agent CMD is, pointed at the proxy the way it reads its endpoint (docs/recipes); auto: "
    "known by CMD's name.",
)
@click.option(
    "--agent-model",
    default=None,
    metavar="NAME",
    help="The model name a coding agent is told to ask for (default: the first the upstream lists at /v1/models).",
)
@click.option(
    "--mcp-config",
    "mcp_configs",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    metavar="PATH",
    help="The agent's MCP configuration (repeatable): a copy with every server wrapped by `toolproxy mcp` "
    "replaces PATH on the command line (and $TOOLPROXY_MCP_CONFIG names it), so the tools' traffic is recorded "
    "in the run; under --playback the recorded servers answer.",
)
@click.option("--print-env", is_flag=True, help="Print the environment the harness would get, and exit.")
@click.option("--no-analyze", is_flag=True, help="Do not analyze when the harness exits.")
@click.argument("command", nargs=-1, required=False, type=click.UNPROCESSED)
def run(
    tags,
    mcp_configs,
    print_env,
    no_analyze,
    command,
    playback_run,
    on_miss,
    pace,
    match,
    agent_name,
    agent_model,
    **options,
):
    """Run a harness behind a proxy: toolproxy run --upstream URL --run NAME -- CMD ARGS...

    The proxy starts on a free loopback port for as long as CMD runs; CMD gets the base-URL
    variables every common client reads (OPENAI_BASE_URL, ANTHROPIC_BASE_URL, OLLAMA_HOST, ...)
    pointing at it with the run's tags, so it needs no change. Signals are passed to CMD, the
    exit code is CMD's, and when it exits the run is analyzed and summarised in one line.
    """
    extra = tags_from_options(tags)
    options["quiet"] = True
    fixture = None
    if playback_run is not None:
        fixture = _playback_fixture(options, playback_run, on_miss, pace, match)
        config = config_from_options(**{**options, "upstream": "http://127.0.0.1:1"})  # checked now, aimed at start
    elif options["upstream"] is None:
        raise click.UsageError("give --upstream URL (the model server), or --playback RUN to answer from a recording")
    else:
        config = config_from_options(**options)
    agent = None if agent_name == "none" else AGENTS.get(agent_name) or agent_of(list(command))
    if agent is not None and agent.protocol == wire.GEMINI:
        bridge_gemini(config)
    if print_env:
        base = f"http://127.0.0.1:{config.port or 'PORT'}" + tag_prefix(config.run, **extra)
        env = harness_env(base, os.environ)
        if agent is not None:
            folder = config.data_dir.resolve() / AGENTS_DIR / agent.name
            made = agent.setup(Pointing(base, agent_model or "MODEL", folder, os.environ))
            env.update({k: v for k, v in made.env.items() if k not in os.environ})
            for path in made.files:
                click.echo(f"# {agent.title}: a file of its own is written to {path}")
        for name, value in sorted(env.items()):
            click.echo(f"{name}={value}")
        return
    if not command:
        raise click.UsageError(
            "give the harness command after --, e.g. toolproxy run --upstream URL -- python agent.py"
        )
    make_data_dir(config)
    mcp = McpOptions(list(mcp_configs)) if mcp_configs else None
    if fixture is not None:
        result = run_loop(run_against_playback(options, fixture, list(command), extra, agent, agent_model, mcp))
    else:
        result = run_loop(run_harness(config, list(command), extra, agent, agent_model, mcp))
    if result.exchanges == 0:
        click.echo(no_request_line(agent), err=True)
    if result.interrupted:
        click.echo("toolproxy run: harness interrupted; what it recorded is kept", err=True)
    elif result.returncode != 0:
        # A harness that fails at start (a missing key variable, a bad model name) may print
        # nothing at all: say that it failed, so its silence is not read as success.
        click.echo(
            f"toolproxy run: the harness exited with code {result.returncode} (toolproxy run exits with it too)",
            err=True,
        )
    if not no_analyze:
        _summarise(config.data_dir, config.run)
    if playback_run is not None:
        if not no_analyze:
            _compare(config.data_dir, playback_run, config.run)
        click.echo(
            f"did the agent behave as recorded: toolproxy compare {printable(playback_run)} {printable(config.run)} "
            f"--data {config.data_dir}",
            err=True,
        )
    sys.exit(result.returncode)


def _compare(data_dir: Path, recorded: str, new: str) -> None:
    """`compare` of the recording and the run against it, on stderr (stdout is the harness's)."""
    done = toolproxy_cli("compare", recorded, new, "--data", str(data_dir))
    click.echo(printable(done.stdout if done.returncode == 0 else done.stderr, lines=True), nl=False, err=True)


def _playback_fixture(options: dict, source: str, on_miss: str, pace: str, match: tuple[str, ...]):
    """(recording, rules, playback options) for `run --playback`; the run's own settings adjusted:
    its traffic gets a run name of its own, goes out untouched (a condition would rewrite the
    requests the recording is matched against) and fingerprints nothing (the upstream is a
    recording)."""
    from toolproxy.playback.options import load
    from toolproxy.playback.server import PlaybackOptions

    if on_miss != "fail" and not options["upstream"]:
        raise click.UsageError(f"--on-miss {on_miss} needs --upstream URL (where a miss is sent)")
    if options["condition"] != "native":
        raise click.UsageError("--playback answers the requests as the harness sends them: leave --condition native")
    options["run"] = options["run"] or f"{source}@playback"
    if options["run"] == source:
        raise click.BadParameter(
            "the harness's traffic needs a run name other than the recording's", param_hint="--run"
        )
    options["no_fingerprint"] = True
    recording, rules = load(options["data_dir"], source, match)
    return (
        recording,
        rules,
        PlaybackOptions(
            run=source,
            on_miss=on_miss,
            upstream=options["upstream"],
            pace=pace,
            data_dir=options["data_dir"],
            on_missed=_miss_line,
        ),
    )


def _summarise(data_dir: Path, run_name: str | None) -> None:
    from toolproxy.record.writer import SEGMENT_DIR

    if not any((data_dir / SEGMENT_DIR).glob("*")):
        click.echo("toolproxy run: nothing was recorded (did the harness call the model?)", err=True)
        return
    runs = [run_name] if run_name else []
    try:
        summaries = analyze_and_summarise(data_dir, runs)
    except click.ClickException as exc:
        click.echo(f"toolproxy run: {exc.message}", err=True)
        return
    for s in summaries:
        for line in [one_line(s), *provenance_lines(s)]:
            click.echo(printable(line), err=True)
    name = run_name or "all-runs"
    html = write_html_report(data_dir, runs, data_dir / "reports" / f"{name}.html")
    if html is not None:
        click.echo(
            f"report: {html}  (toolproxy report --data {data_dir}{' --run ' + run_name if run_name else ''})", err=True
        )
