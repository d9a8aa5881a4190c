"""`toolproxy demo`: the whole loop on this machine, with no model server and no network.

Six "serving stacks" (the emulated ones from toolproxy.emulators, which answer exactly as the
real ones do on the wire) each sit behind a real toolproxy; a small agent harness runs the same
tasks through every one of them; then the real `analyze`, `report` and `compare` commands run on
what was recorded. The point it makes is the project's point: the same model behaviour shows up as
refusals, as calls hidden in text, or as real calls, depending on the stack and the interface,
and toolproxy tells them apart. The scripted model is a correct agent (it calls the right tool,
answers from the result, and makes no call when no tool fits), so its numbers must read: near
100% call and delivered fidelity where the stack works, high call but no delivered fidelity
where the stack leaves calls in text, and the `text` condition restoring delivery.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import click

from toolproxy import emulators
from toolproxy.proxy.config import ProxyConfig
from toolproxy.proxy.server import RunningProxy, start_proxy

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount between currencies.",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
                "required": ["amount", "from", "to"],
                "additionalProperties": False,
            },
        },
    },
]
# (category, question, tool to call or None when no tool fits, arguments). Every item is tagged
# with what it expects, so the analyzer scores the chat item by restraint, not by fidelity.
TASKS = [
    ("weather", "What's the weather in Lisbon right now?", "get_weather", {"city": "Lisbon"}),
    ("weather", "Is it raining in Osaka?", "get_weather", {"city": "Osaka"}),
    ("currency", "How much is 120 USD in EUR?", "convert_currency", {"amount": 120, "from": "USD", "to": "EUR"}),
    ("currency", "Convert 5000 JPY to GBP.", "convert_currency", {"amount": 5000, "from": "JPY", "to": "GBP"}),
    ("chat", "Say hello in Portuguese.", None, None),
]
MARKER = ".toolproxy-demo"


@dataclass(frozen=True)
class Scenario:
    run: str
    stack: str
    model: str
    condition: str = "native"
    tool_parser: str | None = None
    hallucinate_every: int = 0
    story: str = ""


COMPARED = ("sglang-noparser", "sglang-text")
SCENARIOS = [
    Scenario("ollama-qwen", "ollama", "qwen2.5:7b", story="Ollama, a model with the tools capability: real tool_calls"),
    Scenario(
        "ollama-gemma",
        "ollama",
        "gemma3:latest",
        story="Ollama refuses tools for a model without the capability (HTTP 400)",
    ),
    Scenario(
        "vllm-default",
        "vllm",
        "Qwen/Qwen2.5-7B-Instruct",
        story="vLLM launched without --enable-auto-tool-choice: HTTP 400 before the model runs",
    ),
    Scenario(
        "sglang-noparser",
        "sglang",
        "Qwen/Qwen2.5-7B-Instruct",
        story="SGLang without --tool-call-parser: HTTP 200, the call is left in content",
    ),
    Scenario(
        "sglang-text",
        "sglang",
        "Qwen/Qwen2.5-7B-Instruct",
        condition="text",
        story="the same SGLang through toolproxy's text-tools condition: the harness gets tool_calls",
    ),
    Scenario(
        "openai-halluc",
        "openai",
        "gpt-4o-mini",
        hallucinate_every=3,
        story="an OpenAI-compatible API whose model sometimes names a tool that was not offered",
    ),
]


def _model(scenario: Scenario):
    """The scripted model: call the task's tool, then answer from the tool result."""

    def respond(req: emulators.ModelRequest) -> emulators.ScriptedReply:
        messages = req.messages or []
        last = messages[-1] if messages else {}
        if last.get("role") == "tool" or "Tool result" in str(last.get("content", "")):
            return emulators.text("Here is what I found: " + str(last.get("content", ""))[:80])
        task = next((t for t in TASKS if t[1] in json.dumps(messages)), TASKS[-1])
        if task[2] is None:
            return emulators.text("Olá!")
        digest = int(hashlib.sha256(json.dumps(messages).encode()).hexdigest(), 16)
        if scenario.hallucinate_every and digest % scenario.hallucinate_every == 0:
            return emulators.call("web_search", {"query": task[1]})
        return emulators.call(task[2], task[3])

    return respond


async def _agent(session: aiohttp.ClientSession, base: str, model: str, task: tuple, max_turns: int = 4) -> str:
    """A minimal ReAct harness: what most agent loops do, over plain HTTP."""
    messages = [{"role": "user", "content": task[1]}]
    for _ in range(max_turns):
        for _attempt in range(2):  # one retry on 5xx, as harnesses do
            async with session.post(
                base + "/v1/chat/completions", json={"model": model, "messages": messages, "tools": TOOLS}
            ) as r:
                body = await r.json(content_type=None)
                if r.status < 500:
                    break
        if r.status >= 400:
            return f"HTTP {r.status}"
        msg = body["choices"][0]["message"]
        calls = msg.get("tool_calls") or []
        messages.append(
            {"role": "assistant", "content": msg.get("content") or "", **({"tool_calls": calls} if calls else {})}
        )
        if not calls:
            return "answered"
        for c in calls:
            messages.append(
                {"role": "tool", "tool_call_id": c["id"], "content": f"Tool result for {c['function']['name']}: ok"}
            )
    return "turn limit"


async def scenario_proxy(sc: Scenario, upstream: str, data: Path) -> RunningProxy:
    """The proxy `serve` runs, in front of one scenario's stack, recording its run."""
    cfg = ProxyConfig(
        upstream=upstream, data_dir=data, run=sc.run, condition=sc.condition, port=0, quiet=True, commit_window=0.05
    )
    return await start_proxy(cfg)


async def _drive(data: Path, episodes: int) -> list[tuple[Scenario, dict[str, int]]]:
    results = []
    started = []
    try:
        async with aiohttp.ClientSession() as session:
            for sc in SCENARIOS:
                fake = emulators.FakeStack(sc.stack, tool_parser=sc.tool_parser, responder=_model(sc))
                await fake.start()
                started.append(fake)
                proxy = await scenario_proxy(sc, fake.url, data)
                started.append(proxy)
                tally: dict[str, int] = {}
                for ep in range(episodes):
                    task = TASKS[ep % len(TASKS)]
                    expect = "call" if task[2] else "none"
                    base = f"{proxy.url}/t/episode={ep}/item={task[0]}_{ep % len(TASKS)}/expect={expect}"
                    end = await _agent(session, base, sc.model, task)
                    tally[end] = tally.get(end, 0) + 1
                results.append((sc, tally))
    finally:
        for r in reversed(started):
            await r.stop()
    return results


def _run_cli(*args: str) -> None:
    click.secho("$ toolproxy " + " ".join(args), bold=True)
    proc = subprocess.run([sys.executable, "-m", "toolproxy.cli", *args], text=True, capture_output=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise click.ClickException(f"`toolproxy {args[0]}` failed (exit {proc.returncode})")


def _run_lines(data_dir: Path) -> list[str]:
    """Each run's line from the report's JSON, by the one definition `run` and the live page use."""
    from toolproxy.analysis.measure.runline import from_report

    proc = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", "report", "--data", str(data_dir), "--format", "json"],
        text=True,
        capture_output=True,
    )
    if proc.returncode != 0:
        raise click.ClickException(f"`toolproxy report` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return [from_report(run).text() for run in json.loads(proc.stdout)["runs"]]


def default_data_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "toolproxy-demo"


@click.command()
@click.option(
    "--data",
    "data_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the demo records (recreated on each run). Default: toolproxy-demo in the user's cache "
    "directory ($XDG_CACHE_HOME or ~/.cache), never the current directory, so it cannot land in a "
    "checkout or a built package.",
)
@click.option("--episodes", default=10, show_default=True, type=click.IntRange(1, 500), help="Episodes per scenario.")
def demo(data_dir: Path | None, episodes: int) -> None:
    """Run emulated stacks behind toolproxy, drive an agent through them, then analyze and report."""
    if data_dir is None:
        data_dir = default_data_dir()
    if data_dir.exists() and any(data_dir.iterdir()) and not (data_dir / MARKER).exists():
        raise click.UsageError(f"{data_dir} exists and is not a previous demo's directory; choose another --data")
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    (data_dir / MARKER).write_text("created by `toolproxy demo`; safe to delete\n")
    click.secho(f"Recording {len(SCENARIOS)} scenarios x {episodes} episodes into {data_dir}/ ...", bold=True)
    for sc, tally in asyncio.run(_drive(data_dir, episodes)):
        ends = ", ".join(f"{k}: {v}" for k, v in sorted(tally.items()))
        click.echo(f"  {sc.run:<16} {sc.story}\n  {'':<16} the harness saw -> {ends}")
    click.echo()
    _run_cli("analyze", "--data", str(data_dir))
    click.echo("\nWhat toolproxy measured, a line per run (as `toolproxy run` prints it):")
    for line in _run_lines(data_dir):
        click.echo(f"  {line}")
    click.echo()
    _run_cli("report", "--data", str(data_dir))
    html = data_dir / "report.html"
    _run_cli("report", "--data", str(data_dir), "--format", "html", "-o", str(html))
    click.echo()
    _run_cli("compare", *COMPARED, "--data", str(data_dir))
    click.echo(
        f"\nOpen {html} for the charts. Next: "
        f'`toolproxy sql --data {data_dir} "select run, role, outcome, count(*) from turns group by all order by 1"`, '
        f"and `toolproxy serve --upstream URL` in front of your own model server."
    )
