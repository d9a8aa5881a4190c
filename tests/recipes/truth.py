"""The truth rig: every recipe's harness on two one-tool tasks, toolproxy's numbers beside the harness's own.

    python tests/recipes/truth.py                                   # the emulated llama.cpp (seconds per harness)
    python tests/recipes/truth.py --upstream http://127.0.0.1:18431 # a real stack (minutes per harness)
    python tests/recipes/truth.py --only smolagents,dspy --data DIR --timeout 300 [--condition text]

Each harness runs once per task (the weather in Paris, then in Tokyo) through `toolproxy run`,
untagged (one run per harness, no episode tags: toolproxy rebuilds the episodes), in the pinned
virtualenv the recipe checks use, with WEATHER_TRUTH_LOG set: the recipe appends a line for every
real execution of its tool and for its final answer (mini-swe-agent's come from its trajectory).
Then the data directory is analysed and one table printed, also written to DATA/truth.md:

    harness | stack | episodes (ours / harness) | call turns | delivered (ours / executions) | answers (ours / harness)

"ours" is the report's: episodes, turns with role `call`, call turns whose valid call reached the
harness, episodes ending in an `answer` turn. The harness's: tasks it ran, tool executions it
logged (mini-swe-agent: tool messages in its trajectory, not the one it pads in for the submit
command, which it checks, not runs), and answers the agent itself gave after the tool ran. A
harness that ends by calling a tool of its own (smolagents' final_answer, inspect-ai's submit,
mini-swe-agent's submit command) answers by that call, which is neither an execution nor a call
turn. Two kinds of answer the harness returns are not the agent's, and the notes column counts
them apart: a reply it took as the answer without the tool ever running (a call left in the text:
lost, not answered), and the wrap-up it asks for itself when a limit stopped the agent (smolagents'
summary at max_steps, dspy's extraction after max_iters, inspect-ai's last text at its message
limit). A run stopped by --timeout is sent SIGTERM (toolproxy run passes it to the harness and
writes what it recorded), SIGKILL only if it is still there after GRACE seconds.

Each run's own record (the recipe's log lines, mini-swe-agent's trajectory) is kept under
DATA/truth/, beside the recordings. Not part of the test suite or the wheel: rerun it by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_recipes import CHECKS, _clean_env, environment  # noqa: E402
from weather_model import respond  # noqa: E402

from toolproxy.emulators import FakeStack  # noqa: E402

TASKS = ("Paris", "Tokyo")
# The eleven harnesses of issue 20, as the recipe checks run them (check id -> row name).
ROWS = {
    "openai-python": "openai",
    "openai-agents-chat": "openai-agents (chat)",
    "openai-agents-responses": "openai-agents (Responses)",
    "pydantic-ai": "pydantic-ai",
    "langgraph": "langgraph",
    "langchain-openai": "langchain-openai",
    "smolagents": "smolagents (ToolCallingAgent)",
    "litellm": "litellm",
    "anthropic": "anthropic",
    "inspect-ai": "inspect-ai",
    "dspy": "dspy (ReAct)",
    "mini-swe-agent": "mini-swe-agent",
}
GRACE = 30.0  # seconds a timed-out run gets to stop after SIGTERM
# What mini-swe-agent pads its history with for an action it did not run (its submit command ends
# the task inside the environment, before an observation is written).
NOT_EXECUTED = "action was not executed"


def _truth(log: Path, trajectory: Path | None) -> dict:
    """The harness's own account of one task: tool executions, answers the agent gave after the
    tool ran, replies it returned as the answer without the tool running, answers it forced after
    a limit stopped the agent."""
    out = {"executions": 0, "answers": 0, "answers_without_tool": 0, "forced_answers": 0}
    if trajectory is not None:
        if trajectory.exists():
            traj = json.loads(trajectory.read_text())
            out["executions"] = sum(
                1
                for m in traj.get("messages", [])
                if m.get("role") == "tool" and (m.get("extra") or {}).get("exception_info") != NOT_EXECUTED
            )
            submitted = bool((traj.get("info") or {}).get("submission", "").strip())
            out["answers" if out["executions"] else "answers_without_tool"] += submitted
        return out
    for e in (json.loads(line) for line in log.read_text().splitlines()) if log.exists() else ():
        if e["event"] == "tool":
            out["executions"] += 1
        elif e["event"] == "answer" and e.get("answer"):
            out["forced_answers" if e.get("stopped") else "answers" if e["tool_ran"] else "answers_without_tool"] += 1
    return out


def _run(check, upstream: str, data: Path, city: str, timeout: float, condition: str) -> dict:
    bindir = environment(check.harness) / "bin"
    argv = [a.format(python=bindir / "python", bin=bindir) for a in check.argv]
    workdir = Path(tempfile.mkdtemp(prefix=f"truth-{check.id}-", dir=data.parent))
    log = workdir / "truth.jsonl"
    env = {**_clean_env(bindir), "WEATHER_CITY": city, "WEATHER_TRUTH_LOG": str(log)}
    if check.trajectory:  # mini-swe-agent takes its task on the command line
        argv = [a.replace("Paris", city) for a in argv]
    cmd = [
        sys.executable,
        "-m",
        "toolproxy.cli",
        "run",
        "--upstream",
        upstream,
        "--run",
        check.id,
        "--data",
        str(data),
        "--condition",
        condition,
        "--no-analyze",
        "--",
        *argv,
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        code, tail = proc.returncode, (err or out)[-400:]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # to toolproxy run alone: it stops the harness and writes its records
        try:
            proc.communicate(timeout=GRACE)
            code, tail = "timeout", f"stopped after {timeout:g}s"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            code, tail = "killed", f"stopped after {timeout:g}s, killed {GRACE:g}s later"
    trajectory = workdir / check.trajectory if check.trajectory else None
    truth = _truth(log, trajectory)
    kept = data / "truth"
    kept.mkdir(exist_ok=True)
    for src in (log, trajectory):
        if src is not None and src.exists():
            shutil.copy(src, kept / f"{check.id}-{city}-{src.name}")
    shutil.rmtree(workdir, ignore_errors=True)
    return {"exit": code, **truth, "seconds": time.monotonic() - started, "tail": tail}


def _report(data: Path) -> dict[str, dict]:
    tp = [sys.executable, "-m", "toolproxy.cli"]
    done = subprocess.run([*tp, "analyze", "--data", str(data)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"analyze failed: {done.stderr}")
    rep = subprocess.run([*tp, "report", "--data", str(data), "--format", "json"], capture_output=True, text=True)
    return {r["run"]: r for r in json.loads(rep.stdout)["runs"]} if rep.returncode == 0 else {}


def _pair(ours: int | None, theirs: int) -> str:
    mark = "" if ours == theirs else " ≠"
    return f"{'-' if ours is None else ours} / {theirs}{mark}"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def table(stack: str, results: dict[str, list[dict]], report: dict[str, dict]) -> str:
    lines = [
        "| harness | stack | episodes (ours / harness) | call turns | delivered (ours / executions) | "
        "answers (ours / harness) | harness exits | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for check_id, runs in results.items():
        r = report.get(check_id, {})
        roles = r.get("roles") or {}
        notes = []
        untooled = sum(x["answers_without_tool"] for x in runs)
        ours_answers = (r.get("answer_rate") or {}).get("numerator")
        theirs = sum(x["answers"] for x in runs)
        if untooled:
            notes.append(
                f"the harness returned {_plural(untooled, 'reply', 'replies')} as its answer without the tool "
                "ever running (a call left in the text is lost, not answered)"
            )
            if ours_answers is not None and 0 < ours_answers - theirs <= untooled:
                notes.append(
                    f"{ours_answers - theirs} of those came after a tool result that was an error (the tool "
                    "failed before it ran): an answer to the report, which counts any tool result"
                )
        forced = sum(x["forced_answers"] for x in runs)
        if forced:
            notes.append(
                f"{_plural(forced, 'answer', 'answers')} the harness asked for itself after a limit stopped the "
                "agent (its wrap-up, not the agent's answer)"
            )
        stopped = [x for x in runs if x["exit"] in ("timeout", "killed")]
        if stopped:
            notes.append(
                f"{_plural(len(stopped), 'run', 'runs')} stopped by the rig's timeout: the harness's record ends there"
            )
        kinds = r.get("non_response_kinds") or {}
        if kinds:
            notes.append("non-responses " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
        if roles.get("no_tools"):
            notes.append(f"{_plural(roles['no_tools'], 'no_tools turn', 'no_tools turns')}")
        lines.append(
            " | ".join(
                [
                    f"| {ROWS[check_id]}",
                    stack,
                    _pair(r.get("episodes"), len(runs)),
                    str(roles.get("call", 0)),
                    _pair((r.get("delivered_fidelity") or {}).get("numerator"), sum(x["executions"] for x in runs)),
                    _pair(ours_answers, theirs),
                    ", ".join(str(x["exit"]) for x in runs),
                    "; ".join(notes) or "-",
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", help="a real stack's root URL (default: an emulated llama.cpp started here)")
    ap.add_argument(
        "--data", type=Path, help="where to record (default: a new temporary directory); it is emptied first"
    )
    ap.add_argument("--only", help="comma-separated check ids (default: all of " + ", ".join(ROWS) + ")")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per harness run (default 600)")
    ap.add_argument("--condition", default="native", help="the interface condition of every run (default native)")
    args = ap.parse_args()
    wanted = args.only.split(",") if args.only else list(ROWS)
    unknown = set(wanted) - set(ROWS)
    if unknown:
        raise SystemExit(f"unknown check ids: {', '.join(sorted(unknown))}; choose from {', '.join(ROWS)}")
    data = args.data or Path(tempfile.mkdtemp(prefix="toolproxy-truth-")) / "data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    checks = {c.id: c for c in CHECKS}
    fake = None if args.upstream else FakeStack("llamacpp", responder=respond)
    results: dict[str, list[dict]] = {}
    with fake.in_thread() if fake is not None else nullcontext(args.upstream) as upstream:
        for check_id in wanted:
            results[check_id] = []
            for city in TASKS:
                out = _run(checks[check_id], upstream, data, city, args.timeout, args.condition)
                results[check_id].append(out)
                print(
                    f"{check_id} {city}: exit {out['exit']}, {out['executions']} executions, {out['answers']} answers "
                    f"(+{out['answers_without_tool']} without the tool, +{out['forced_answers']} forced), "
                    f"{out['seconds']:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
    stack = ("emulated llama.cpp" if fake is not None else f"real ({args.upstream})") + (
        f", {args.condition}" if args.condition != "native" else ""
    )
    text = table(stack, results, _report(data))
    (data / "truth.md").write_text(text)
    (data / "truth.json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)
    print(f"recorded in {data}; toolproxy report --data {data}", file=sys.stderr)


if __name__ == "__main__":
    main()
