"""Record a coding agent's traffic through `toolproxy serve`, with the agent's own record beside it.

Not part of the test suite: the agents are not toolproxy dependencies. Each is installed at its
pinned version (AGENTS below) into a cache of its own, npm packages with `npm install -g --prefix`,
PyPI ones into a virtualenv, and run with a private HOME (and XDG folders) in a scratch git
repository, pointed at `toolproxy serve` (untagged: no run, episode or item tags) in front of an
emulated stack whose scripted model (models.py) does the case's task with the agent's own tools:

    python tests/data/agents/capture.py CASE OUT_DIR [--upstream URL --model NAME] [--cache DIR]

OUT_DIR gets `segments/` (the proxy's segment files, unedited), `agent/` (the agent's own record:
its structured output and the session files it keeps under HOME, as it wrote them, with the scratch
folder's path replaced by `/CAPTURE`) and `capture.json` (the agent, its version, the commands, their
exit codes). With --upstream the same case runs against a real server (the model name it serves
given by --model). Agents are data: a new one is an `Agent` entry (how it is installed, pointed at a
base URL and asked to do a task, and where its record is) and a responder in models.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolproxy.emulators import FakeStack
from toolproxy.emulators.faults import keepalive, stall

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]
from models import MODELS  # noqa: E402
from proxyprocess import ProxyProcess  # noqa: E402

CACHE = Path(os.environ.get("TOOLPROXY_AGENTS", Path.home() / ".cache" / "toolproxy-agents"))
TASK = "create hello.txt containing hi"


@dataclass
class Scratch:
    """Where one capture runs: the private HOME, the repository the agent works in, the proxy."""

    root: Path
    proxy: str = ""
    model: str = ""
    provider: dict = field(default_factory=dict)  # the case's settings for the agent's model provider

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def repo(self) -> Path:
        return self.root / "repo"


@dataclass(frozen=True)
class Agent:
    """One coding agent as data: its package, how it is pointed at the proxy, how it is asked to do a
    task (`argv(scratch, prompt, step)`: step 0 is the first process of a case, later ones continue
    its session), and which files under HOME are its own record."""

    name: str
    registry: str  # "npm" or "pypi"
    package: str
    version: str
    binary: str
    configure: Callable[[Scratch], dict]  # writes config files, returns the environment to add
    argv: Callable[[Scratch, str, int], list[str]]
    records: tuple[str, ...] = ()  # globs under HOME (or the repo, "repo:GLOB") copied as the agent's record
    extras: tuple[str, ...] = ()  # other pip requirements installed beside it
    # writes what else is the agent's record into the folder given (asking the agent itself)
    collect: Callable[[Scratch, dict, Path, Path], None] | None = None

    def install(self, cache: Path) -> Path:
        """The agent's executable, installed into the cache at its pinned version if it is not there."""
        where = cache / self.registry / f"{self.package.replace('/', '+')}@{self.version}"
        exe = where / "bin" / self.binary
        if not exe.exists():
            if self.registry == "npm":
                subprocess.run(
                    [
                        "npm",
                        "install",
                        "-g",
                        "--no-fund",
                        "--no-audit",
                        "--prefix",
                        str(where),
                        f"{self.package}@{self.version}",
                    ],
                    check=True,
                )
            else:
                subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
                subprocess.run(
                    [str(where / "bin" / "pip"), "install", "-q", f"{self.package}=={self.version}", *self.extras],
                    check=True,
                )
        return exe


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- each agent: how it is pointed at a base URL (see docs/agents in the manual for the same facts)


def _claude_env(s: Scratch) -> dict:
    # the non-essential traffic switches are left as a user leaves them: the title request is part
    # of what is captured
    return {
        "ANTHROPIC_BASE_URL": s.proxy,
        "ANTHROPIC_API_KEY": "sk-capture",
        "ANTHROPIC_MODEL": s.model,
        "ANTHROPIC_SMALL_FAST_MODEL": s.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": s.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": s.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": s.model,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def _claude_argv(s: Scratch, prompt: str, step: int) -> list[str]:
    return [
        "-p",
        prompt,
        "--permission-mode",
        "acceptEdits",
        "--output-format",
        "stream-json",
        "--verbose",
        *(["--continue"] if step else []),
    ]


def _codex_env(s: Scratch) -> dict:
    settings = "".join(f"{k} = {v}\n" for k, v in s.provider.items())
    _write(
        s.home / ".codex" / "config.toml",
        f"""model_provider = "tp"
model = "{s.model}"
check_for_update_on_startup = false

[model_providers.tp]
name = "toolproxy"
base_url = "{s.proxy}/v1"
wire_api = "responses"
env_key = "TP_API_KEY"
supports_websockets = true
{settings}
[analytics]
enabled = false

[otel]
exporter = "none"
""",
    )
    return {"CODEX_HOME": str(s.home / ".codex"), "TP_API_KEY": "sk-capture"}


def _codex_argv(s: Scratch, prompt: str, step: int) -> list[str]:
    return ["exec", "--skip-git-repo-check", "-s", "workspace-write", "--json", prompt]


def _gemini_like_settings(path: Path, auth: str) -> None:
    _write(
        path,
        json.dumps(
            {
                "security": {"auth": {"selectedType": auth}},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "general": {"enableAutoUpdate": False},
            }
        ),
    )


def _qwen_env(s: Scratch) -> dict:
    _gemini_like_settings(s.home / ".qwen" / "settings.json", "openai")
    return {"OPENAI_BASE_URL": s.proxy + "/v1", "OPENAI_API_KEY": "sk-capture", "OPENAI_MODEL": s.model}


def _qwen_argv(s: Scratch, prompt: str, step: int) -> list[str]:
    return ["-p", prompt, "--yolo", "--output-format", "stream-json"]


def _opencode_env(s: Scratch) -> dict:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            "tp": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "toolproxy",
                "options": {"baseURL": s.proxy + "/v1", "apiKey": "sk-capture"},
                "models": {s.model: {"name": s.model}},
            }
        },
        "model": f"tp/{s.model}",
        "small_model": f"tp/{s.model}",
    }
    _write(s.home / "opencode.json", json.dumps(config))
    return {
        "OPENCODE_CONFIG": str(s.home / "opencode.json"),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_PERMISSION": json.dumps({"edit": "allow", "bash": "allow"}),
    }


def _opencode_argv(s: Scratch, prompt: str, step: int) -> list[str]:
    return ["run", "--format", "json", prompt]


def _opencode_collect(s: Scratch, env: dict, exe: Path, dest: Path) -> None:
    """opencode keeps its sessions in SQLite: each session (a subagent's is a child session, its
    parent_id the task's) as `opencode export` writes it."""
    import sqlite3

    db = s.home / ".local" / "share" / "opencode" / "opencode.db"
    with contextlib.closing(sqlite3.connect(db)) as con:
        sessions = con.execute("SELECT id, parent_id, title FROM session ORDER BY time_created").fetchall()
    (dest / "sessions.json").write_text(
        json.dumps([{"id": i, "parent_id": p, "title": t} for i, p, t in sessions], indent=1) + "\n"
    )
    for sid, _, _ in sessions:
        code, out, _ = _run([str(exe), "export", sid], env, s.repo, 60)
        (dest / f"export-{sid}.json").write_text(out.replace(str(s.root), "/CAPTURE"))


def _aider_env(s: Scratch) -> dict:
    return {
        "OPENAI_API_KEY": "sk-capture",
        "AIDER_CHECK_UPDATE": "false",
        "AIDER_ANALYTICS": "false",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def _aider_argv(s: Scratch, prompt: str, step: int) -> list[str]:
    return [
        "--openai-api-base",
        s.proxy + "/v1",
        "--model",
        f"openai/{s.model}",
        "--edit-format",
        "whole",
        "--yes-always",
        "--no-check-update",
        "--no-show-model-warnings",
        "--no-pretty",
        "--no-stream",
        "--analytics-disable",
        "--message",
        prompt,
        "hello.txt",
    ]


def _mini_env(s: Scratch) -> dict:
    # as toolproxy.drive.harness sets them: no first-run setup, no price list from the internet
    return {
        "OPENAI_BASE_URL": s.proxy + "/v1",
        "OPENAI_API_BASE": s.proxy + "/v1",
        "OPENAI_API_KEY": "sk-capture",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def _mini_argv(s: Scratch, prompt: str, step: int) -> list[str]:
    return [
        "-m",
        f"openai/{s.model}",
        "-t",
        prompt,
        "--yolo",
        "--exit-immediately",
        "-o",
        str(s.home / "trajectory.json"),
    ]


AGENTS = {
    a.name: a
    for a in (
        Agent(
            "claude",
            "npm",
            "@anthropic-ai/claude-code",
            "2.1.197",
            "claude",
            _claude_env,
            _claude_argv,
            records=(".claude/projects/**/*.jsonl",),
        ),
        Agent(
            "codex",
            "npm",
            "@openai/codex",
            "0.171.0",
            "codex",
            _codex_env,
            _codex_argv,
            records=(".codex/sessions/**/*.jsonl",),
        ),
        Agent(
            "qwen",
            "npm",
            "@qwen-code/qwen-code",
            "0.15.10",
            "qwen",
            _qwen_env,
            _qwen_argv,
            records=(".qwen/projects/*/chats/*.jsonl",),
        ),
        Agent(
            "opencode",
            "npm",
            "opencode-ai",
            "1.18.33",
            "opencode",
            _opencode_env,
            _opencode_argv,
            collect=_opencode_collect,
        ),
        Agent(
            "aider",
            "pypi",
            "aider-chat",
            "0.86.2",
            "aider",
            _aider_env,
            _aider_argv,
            records=("repo:.aider.chat.history.md", "repo:.aider.input.history"),
        ),
        Agent(
            "mini-swe-agent",
            "pypi",
            "mini-swe-agent",
            "2.4.6",
            "mini",
            _mini_env,
            _mini_argv,
            records=("trajectory.json",),
        ),
    )
}


@dataclass(frozen=True)
class Case:
    """One capture: an agent, the prompts it is given (one process each; later ones continue the
    session where the agent can), the scripted model, and what else the case needs."""

    agent: str
    prompts: tuple[str, ...]
    model: str
    shows: str
    env: dict = field(default_factory=dict)
    timeout: float = 180
    faults: tuple = ()  # toolproxy.emulators faults the emulated stack injects (a stall, a cut)
    provider: dict = field(default_factory=dict)  # Codex: settings of its model provider


CASES = {
    "claude-title": Case("claude", (TASK,), "claude", "the task and Claude Code's title request beside it"),
    "claude-subagent": Case(
        "claude",
        (f"Use the Agent tool (general-purpose) to {TASK}.",),
        "claude",
        "the Agent tool: a subagent's conversation started by a delivered call, its answer the call's result",
    ),
    "claude-compact": Case(
        "claude",
        (TASK, "/compact", "Now say what hello.txt contains."),
        "claude",
        "/compact in the task's session (--continue): the summary request, then the task going on from the summary",
    ),
    # the first request's answer stalls 8 s before its status line; Claude Code's API_TIMEOUT_MS (2 s
    # here, 600 s by default) gives up on it and asks again. Its non-essential traffic is off so
    # that the stalled request is the task's (the title request would otherwise race it)
    "claude-abandon": Case(
        "claude",
        (TASK,),
        "claude",
        "a client that gives up waiting: Claude Code's API_TIMEOUT_MS "
        "abandons a request the stack has not answered, then asks again",
        env={"API_TIMEOUT_MS": "2000", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
        faults=(lambda: stall(before=8.0, times=1, path="/v1/messages"),),
    ),
    # llama-server's keep-alive comments for 4 s before the first event: Claude Code waits (its stream
    # idle watchdog is 300 s at least), the proxy's first byte comes in milliseconds, the first token
    # seconds later
    "claude-keepalive": Case(
        "claude",
        (TASK,),
        "claude",
        "a first token seconds after the first byte: the stack sends keep-alive comments before its first event",
        env={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
        faults=(lambda: keepalive(4.0, every=0.5, times=1, path="/v1/messages"),),
    ),
    # the same before Codex, whose stream_idle_timeout_ms (2 s here, 300 s by default) counts no
    # comment as activity: it gives up on the stream with bytes but no event, and asks again
    "codex-abandon": Case(
        "codex",
        (TASK,),
        "codex",
        "a client that gives up on a stream of keep-alive comments: Codex's stream_idle_timeout_ms, then its retry",
        faults=(lambda: keepalive(6.0, every=0.5, times=1, path="/v1/responses"),),
        provider={"stream_idle_timeout_ms": 2000, "stream_max_retries": 2},
    ),
    "codex": Case(
        "codex",
        (TASK,),
        "codex",
        "Codex over HTTP Responses through a custom model_provider, its WebSocket "
        "attempt first (answered as the proxy answers it today)",
    ),
    "qwen-memory": Case(
        "qwen",
        ("What does git status do? Answer in one line.",),
        "qwen",
        "a question answered without a tool, then Qwen Code's managed-memory pass continuing the conversation",
    ),
    "qwen-write": Case("qwen", (TASK,), "qwen", "Qwen Code's write_file, one task"),
    "opencode-title": Case("opencode", (TASK,), "opencode", "the task and opencode's title request"),
    "opencode-subagent": Case(
        "opencode",
        (f"Use the task tool (general) to {TASK}.",),
        "opencode",
        "opencode's task tool: a subagent session started by a delivered call",
    ),
    "aider": Case("aider", (TASK,), "aider", "aider's whole-file edit (no tools) and its commit-message request"),
    "mini-swe-agent": Case(
        "mini-swe-agent", (TASK,), "mini-swe-agent", "mini-swe-agent's bash tool and its submit command"
    ),
}


def _stop_group(proc: subprocess.Popen) -> None:
    """An agent re-spawns children (Qwen Code a node child): its whole process group goes."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def _run(argv: list[str], env: dict, cwd: Path, timeout: float) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        out, err = proc.communicate()
        code = 124
    except BaseException:  # stopped itself (SIGTERM, Ctrl-C): the agent goes too
        _stop_group(proc)
        raise
    with contextlib.suppress(ProcessLookupError):  # children left behind by a finished agent
        os.killpg(proc.pid, signal.SIGTERM)
    return code, out, err


def _copy_records(agent: Agent, s: Scratch, dest: Path) -> None:
    for pattern in agent.records:
        base, glob = (s.repo, pattern[5:]) if pattern.startswith("repo:") else (s.home, pattern)
        for path in sorted(base.glob(glob)):
            if path.is_file():
                target = dest / ("repo" if base == s.repo else "home") / path.relative_to(base)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(path.read_text(errors="replace").replace(str(s.root), "/CAPTURE"))


def capture(
    case_name: str, out: Path, upstream: str | None, model: str | None, cache: Path, timeout: float | None = None
) -> int:
    case = CASES[case_name]
    agent = AGENTS[case.agent]
    exe = agent.install(cache)
    for old in ("segments", "agent"):  # a capture replaces the one before it whole
        shutil.rmtree(out / old, ignore_errors=True)
    (out / "agent").mkdir(parents=True)
    root = Path(tempfile.mkdtemp(prefix="tp-agent-"))
    s = Scratch(root)
    s.home.mkdir()
    s.repo.mkdir()
    subprocess.run(["git", "init", "-q", str(s.repo)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(s.repo),
            "-c",
            "user.name=capture",
            "-c",
            "user.email=capture@example.invalid",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "start",
        ],
        check=True,
    )
    fake = None if upstream else FakeStack("llamacpp", responder=MODELS[case.model])
    if fake is not None:
        fake.inject(*(make() for make in case.faults))
    steps = []
    try:
        with fake.in_thread() if fake else contextlib.nullcontext(upstream) as url:
            proxy = ProxyProcess(url, root / "data", ("--durability", "sync"))
            try:
                s.proxy, s.model = proxy.url, (fake.model if fake else model or "qwen")
                s.provider = case.provider
                env = {
                    "PATH": f"{exe.parent}{os.pathsep}{os.environ['PATH']}",
                    "HOME": str(s.home),
                    "XDG_CONFIG_HOME": str(s.home / ".config"),
                    "XDG_DATA_HOME": str(s.home / ".local" / "share"),
                    "XDG_CACHE_HOME": str(s.home / ".cache"),
                    "XDG_STATE_HOME": str(s.home / ".local" / "state"),
                    "GIT_AUTHOR_NAME": "capture",
                    "GIT_AUTHOR_EMAIL": "capture@example.invalid",
                    "GIT_COMMITTER_NAME": "capture",
                    "GIT_COMMITTER_EMAIL": "capture@example.invalid",
                    "TERM": "dumb",
                    "NO_COLOR": "1",
                    "LANG": "C.UTF-8",
                }
                env.update(agent.configure(s))
                env.update(case.env)
                for step, prompt in enumerate(case.prompts):
                    argv = [str(exe), *agent.argv(s, prompt, step)]
                    started = time.time()
                    code, stdout, stderr = _run(argv, env, s.repo, timeout or case.timeout)
                    (out / "agent" / f"stdout-{step}.jsonl").write_text(stdout.replace(str(root), "/CAPTURE"))
                    steps.append(
                        {
                            "argv": [a.replace(str(root), "/CAPTURE") for a in argv[1:]],
                            "exit": code,
                            "seconds": round(time.time() - started, 1),
                            "stderr_tail": stderr[-2000:].replace(str(root), "/CAPTURE"),
                        }
                    )
            finally:
                proxy.stop()
        (out / "segments").mkdir(exist_ok=True)
        for seg in sorted((root / "data" / "segments").glob("*.jsonl")):
            shutil.copy(seg, out / "segments" / seg.name)
        _copy_records(agent, s, out / "agent")
        if agent.collect is not None:
            agent.collect(s, env, exe, out / "agent")
        files = sorted(str(p.relative_to(s.repo)) for p in s.repo.rglob("*") if p.is_file() and ".git" not in p.parts)
        doc = {
            "case": case_name,
            "shows": case.shows,
            "agent": agent.name,
            "package": agent.package,
            "version": agent.version,
            "stack": "emulated llamacpp" if fake else upstream,
            "model": s.model,
            "env": case.env,
            "steps": steps,
            "repo_files": files,
            "hello.txt": (s.repo / "hello.txt").read_text() if (s.repo / "hello.txt").exists() else None,
        }
        (out / "capture.json").write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        if not os.environ.get("CAPTURE_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    return max((st["exit"] for st in steps), default=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--upstream", default=None, help="a real server instead of the emulated stack")
    ap.add_argument("--model", default=None, help="the model name the real server serves")
    ap.add_argument("--cache", type=Path, default=CACHE, help="where the agents are installed (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds each process may take (a real model is slow)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped capture stops its agent and proxy
    sys.exit(capture(args.case, args.out, args.upstream, args.model, args.cache, args.timeout))


if __name__ == "__main__":
    main()
