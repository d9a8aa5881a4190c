"""The scripted model behind the coding-agent captures: it does the one small task with each agent's
own tools, reading only the request (so an agent's concurrent requests, its side requests beside
the task, and a subagent's conversation each get the reply their own state calls for).

Side requests are answered as the agent asks for them (a title as JSON or as a line, a summary in
the tags the compaction prompt names, a memory pass that saves nothing); the prompts they are known
by are the agents' own (see tests/data/agents/README.md for where each is written).
"""

from __future__ import annotations

import json

from toolproxy.emulators import ModelRequest, ScriptedReply, call, text

FILE, CONTENT = "hello.txt", "hi\n"
DONE = "Created hello.txt containing hi."
SUMMARY = (
    "<analysis>The user asked for hello.txt containing hi; it was written.</analysis>\n<summary>\n"
    "1. Primary Request and Intent: create hello.txt containing hi.\n2. Files and Code Sections: hello.txt "
    "(created, contains hi).\n3. Pending Tasks: none.\n</summary>"
)


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _system(req: ModelRequest) -> str:
    return "\n".join(
        _text_of(m.get("content")) for m in req.messages if isinstance(m, dict) and m.get("role") == "system"
    )


def _last(req: ModelRequest) -> dict:
    """The conversation's last message that is not a system note (Claude Code appends system
    messages after tool results: its list of agent types, its skills)."""
    said = [m for m in req.messages if isinstance(m, dict) and m.get("role") != "system"]
    return said[-1] if said else {}


def _after_result(req: ModelRequest) -> bool:
    """The conversation ends with a tool's result: the model has seen what its call did."""
    return _last(req).get("role") == "tool"


def _users(req: ModelRequest) -> str:
    return "\n".join(
        _text_of(m.get("content")) for m in req.messages if isinstance(m, dict) and m.get("role") == "user"
    )


def _cwd_file(req: ModelRequest) -> str:
    """The absolute path of hello.txt in the agent's working directory, read from the prompt the agent
    wrote (Claude Code, Qwen Code and opencode want absolute paths)."""
    flat = _system(req) + "\n" + _users(req)
    for marker in (
        "Primary working directory: ",
        "Working directory: ",
        "I'm currently working in the directory: ",
        "<cwd>",
        "working directory: ",
    ):
        at = flat.find(marker)
        if at >= 0:
            rest = flat[at + len(marker) :]
            end = min(i for i in (rest.find("\n"), rest.find("<"), len(rest)) if i >= 0)
            return rest[:end].strip().rstrip("/") + "/" + FILE
    return FILE


def _side(req: ModelRequest) -> ScriptedReply | None:
    """The reply to a side request, by the prompt each agent writes for it; None for a task turn."""
    system, last = _system(req), _text_of(_last(req).get("content"))
    if "Generate a concise, sentence-case title" in system:  # Claude Code: JSON by its output schema
        return text(json.dumps({"title": "Create hello file"}))
    if "You are a title generator" in system:  # opencode
        return text("Create hello file")
    if "Your task is to create a detailed summary of the conversation" in last:  # Claude Code's compaction
        return text(SUMMARY)
    if "managed memory extraction subagent" in system:  # Qwen Code's memory pass
        return text("Nothing durable to save.")
    return None


def claude(req: ModelRequest) -> ScriptedReply:
    """Claude Code: Write, then a line saying so. Asked to delegate ("Use the Agent tool"), the parent
    calls Agent; the subagent (whose conversation starts from the prompt the parent wrote) calls
    Write and reports; the parent then relays the report."""
    if (side := _side(req)) is not None:
        return side
    if _after_result(req):
        return text(DONE)
    if "say what hello.txt contains" in _text_of(_last(req).get("content")):  # after the compaction
        return text("hello.txt contains hi.")
    if "Use the Agent tool" in _users(req):
        return call(
            "Agent",
            {
                "description": "Create hello file",
                "prompt": f"Create {FILE} containing hi.",
                "subagent_type": "general-purpose",
            },
        )
    return call("Write", {"file_path": _cwd_file(req), "content": CONTENT})


def codex(req: ModelRequest) -> ScriptedReply:
    """Codex: one exec_command writing the file, then a line saying so."""
    if _after_result(req):
        return text(DONE)
    return call("exec_command", {"cmd": f"printf 'hi\\n' > {FILE}"})


def qwen(req: ModelRequest) -> ScriptedReply:
    """Qwen Code: write_file, then a line. Asked a question ("What does"), it answers in prose
    without a tool (which is when Qwen Code's memory pass follows the task)."""
    if (side := _side(req)) is not None:
        return side
    if _after_result(req):
        return text(DONE)
    if "What does git status do" in _users(req):
        return text("It shows the working tree's changes: staged, unstaged and untracked files.")
    return call("write_file", {"file_path": _cwd_file(req), "content": CONTENT})


def opencode(req: ModelRequest) -> ScriptedReply:
    """opencode: write, then a line. Asked to delegate ("Use the task tool"), the parent calls task
    and the subagent writes."""
    if (side := _side(req)) is not None:
        return side
    if _after_result(req):
        return text(DONE)
    if "Use the task tool" in _users(req) and "task" in req.tools:
        return call(
            "task",
            {"description": "Create hello file", "prompt": f"Create {FILE} containing hi.", "subagent_type": "general"},
        )
    return call("write", {"filePath": _cwd_file(req), "content": CONTENT})


def aider(req: ModelRequest) -> ScriptedReply:
    """aider (no tools: its `whole` edit format, the file's name then its content in a fence). Its
    commit-message request gets a commit message."""
    system = _system(req)
    if "commit message" in system.lower():
        return text("Add hello.txt containing hi")
    if "summar" in system.lower() and not req.tools:
        return text("The user asked for hello.txt containing hi; it was created.")
    return text(f"I will create {FILE}.\n\n{FILE}\n```\nhi\n```\n")


def mini_swe_agent(req: ModelRequest) -> ScriptedReply:
    """mini-swe-agent: one bash call writing the file, then the command that submits."""
    if _after_result(req):
        return call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    return call("bash", {"command": f"printf 'hi\\n' > {FILE} && cat {FILE}"})


MODELS = {
    "claude": claude,
    "codex": codex,
    "qwen": qwen,
    "opencode": opencode,
    "aider": aider,
    "mini-swe-agent": mini_swe_agent,
}
