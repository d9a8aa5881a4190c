"""Each coding agent's own record of a capture, read into one shape: the expected value of the tests.

What counts is what the agent itself wrote: its structured output (`stdout-N.jsonl`, one per
process of the case) and the session files it keeps. Standard library only.

`own(case_dir)` returns:
- `tasks`: the task conversations the agent ran (its sessions; a subagent's is not one);
- `subagents`: the conversations a tool call of the task started (Claude Code's Agent tool,
  opencode's task tool), each with the id of the call that started it;
- `tool_uses`: the calls the agent ran (a result came back for each: the harness executed it),
  subagents' included, with who ran them;
- `answers`: the task's final text as the agent reports it, one per task conversation that ended
  with one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


def _lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _stdouts(case: Path) -> list[list[dict]]:
    return [_lines(p) for p in sorted((case / "agent").glob("stdout-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))]


def _claude_like(case: Path) -> dict:
    """Claude Code and Qwen Code `--output-format stream-json`: assistant messages with tool_use
    blocks, user messages with their tool_result blocks (a subagent's carry parent_tool_use_id),
    and one `result` line per process."""
    sessions: list[str] = []
    uses: dict[str, dict] = {}
    ran: list[dict] = []
    answers: list[str] = []
    subagents: dict[str, str] = {}
    for lines in _stdouts(case):
        for d in lines:
            sid = d.get("session_id")
            if sid and sid not in sessions and d.get("type") in ("system", "assistant", "result"):
                sessions.append(sid)
            content = (d.get("message") or {}).get("content")
            blocks = content if isinstance(content, list) else []
            who = d.get("parent_tool_use_id")
            if d.get("type") == "assistant":
                for b in blocks:
                    if isinstance(b, dict) and b.get("type") == "tool_use":
                        uses[b["id"]] = {"name": b["name"], "by": who, "input": b.get("input")}
                        if b["name"] in ("Agent", "Task", "agent"):
                            subagents[b["id"]] = b["name"]
            elif d.get("type") == "user":
                for b in blocks:
                    if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") in uses:
                        use = uses[b["tool_use_id"]]
                        ran.append({**use, "id": b["tool_use_id"], "error": bool(b.get("is_error"))})
            elif d.get("type") == "result" and d.get("result"):
                answers.append(d["result"])
    return {
        "tasks": len(sessions),
        "subagents": [{"call": cid, "tool": name} for cid, name in subagents.items()],
        "tool_uses": ran,
        "answers": answers,
    }


def _codex(case: Path) -> dict:
    """`codex exec --json`: a thread per task, `command_execution` items it ran, `agent_message` items."""
    threads, ran, answers = 0, [], []
    for lines in _stdouts(case):
        last = None
        for d in lines:
            if d.get("type") == "thread.started":
                threads += 1
            item = d.get("item") or {}
            if d.get("type") == "item.completed" and item.get("type") == "command_execution":
                ran.append(
                    {
                        "name": "exec_command",
                        "by": None,
                        "input": item.get("command"),
                        "error": item.get("exit_code") not in (0, None),
                    }
                )
            if d.get("type") == "item.completed" and item.get("type") == "agent_message":
                last = item.get("text")
        if last:
            answers.append(last)
    return {"tasks": threads, "subagents": [], "tool_uses": ran, "answers": answers}


def _opencode(case: Path) -> dict:
    """`opencode export` of each session: a subagent's session has the task's as parent, and the
    parent's task tool part names it in its metadata."""
    sessions = json.loads((case / "agent" / "sessions.json").read_text())
    ran, answers, subagents = [], [], []
    for s in sessions:
        doc = json.loads((case / "agent" / f"export-{s['id']}.json").read_text())
        last_text = None
        for message in doc.get("messages", []):
            for part in message.get("parts", []):
                if part.get("type") == "tool" and (part.get("state") or {}).get("status") in ("completed", "error"):
                    ran.append(
                        {
                            "name": part["tool"],
                            "by": s["parent_id"] and s["id"],
                            "input": part["state"].get("input"),
                            "error": part["state"]["status"] == "error",
                            "id": part.get("callID"),
                        }
                    )
                    if part["tool"] == "task":
                        subagents.append({"call": part.get("callID"), "tool": "task"})
                if part.get("type") == "text" and (message.get("info") or {}).get("role") == "assistant":
                    last_text = part.get("text")
        if s["parent_id"] is None and last_text:
            answers.append(last_text)
    return {
        "tasks": sum(s["parent_id"] is None for s in sessions),
        "subagents": subagents,
        "tool_uses": ran,
        "answers": answers,
    }


def _aider(case: Path) -> dict:
    """The chat history file: a `####` line per request of the user, the reply after it, and
    `Applied edit to FILE` for each edit aider wrote (aider offers no tools: its edits are text)."""
    text = (case / "agent" / "repo" / ".aider.chat.history.md").read_text()
    asks = re.findall(r"^#### (.+)$", text, re.M)
    replies = re.split(r"^#### .+$", text, flags=re.M)[1:]
    answers = [r.split("\n> ")[0].strip() for r in replies]
    edits = re.findall(r"^> Applied edit to (.+?)\s*$", text, re.M)
    return {"tasks": len(asks), "subagents": [], "tool_uses": [], "answers": [a for a in answers if a], "edits": edits}


SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _mini(case: Path) -> dict:
    """mini-swe-agent's trajectory: its messages (tool messages are the commands it ran) and `info`."""
    traj = json.loads((case / "agent" / "home" / "trajectory.json").read_text())
    ran = []
    calls = {}
    for m in traj.get("messages", []):
        for tc in m.get("tool_calls") or []:
            calls[tc["id"]] = tc["function"]
        if m.get("role") == "tool" and m.get("tool_call_id") in calls:
            call = calls[m["tool_call_id"]]
            if SUBMIT in call["arguments"]:  # its submit command ends the task: the answer, not a tool use
                continue
            ran.append({"name": call["name"], "by": None, "input": call["arguments"], "error": False})
    info = traj.get("info") or {}
    return {
        "tasks": 1,
        "subagents": [],
        "tool_uses": ran,
        "answers": [info["submission"]] if info.get("exit_status") == "Submitted" else [],
        "exit_status": info.get("exit_status"),
    }


def _gemini(case: Path) -> dict:
    """Gemini CLI's `--output-format json`: its final response and its own tool statistics (how
    many calls of each tool it ran, and how many failed; it keeps no arguments there)."""
    out = json.loads((case / "agent" / "stdout-0.json").read_text())
    by_name = ((out.get("stats") or {}).get("tools") or {}).get("byName") or {}
    ran = [
        {"name": name, "by": None, "input": None, "error": i >= tool.get("success", 0)}
        for name, tool in sorted(by_name.items())
        for i in range(tool.get("count", 0))
    ]
    return {"tasks": 1, "subagents": [], "tool_uses": ran, "answers": [out["response"]] if out.get("response") else []}


READERS = {
    "claude": _claude_like,
    "qwen": _claude_like,
    "codex": _codex,
    "opencode": _opencode,
    "aider": _aider,
    "mini-swe-agent": _mini,
    "gemini-cli": _gemini,
}


def own(case: Path) -> dict:
    """The agent's own account of the capture in `case` (a folder capture.py wrote)."""
    meta = json.loads((case / "capture.json").read_text())
    return {"agent": meta["agent"], "version": meta["version"], **READERS[meta["agent"]](case)}
