"""What particular harnesses write, kept as data in one place.

Episode building and roles are generic (analysis.episodes), but two facts can only be read in words
a harness chooses: that it rejected the model's last reply (it could not parse a call out of it,
and says so in its next request), and that a call ends the episode as the model's answer (the
harness's own finishing tool, as it describes it when it offers it). Each entry names the harness
it comes from; add new ones here.
(How prompt-protocol harnesses write their tool lists and steps is analysis.classify.protocols' to read.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Text a harness writes into its next request when it could not use the model's reply: that reply
# was not an answer, whatever it looked like, and the harness asked again.
REJECTIONS = (
    "Error while parsing tool call from model output",  # smolagents ToolCallingAgent
    "Your code snippet is invalid, because the regex pattern",  # smolagents CodeAgent, no code block
    "Error in code parsing:",  # smolagents CodeAgent, code that is not Python
    "Invalid Format: Missing 'Action:' after 'Thought:'",  # LangChain ReAct (handle_parsing_errors)
    "Invalid Format: Missing 'Action Input:' after 'Action:'",  # LangChain ReAct
    "Could not parse LLM output:",  # LangChain agents
    "Invalid or incomplete response",  # LangChain agents (handle_parsing_errors, the error not sent)
    # mini-swe-agent 2.x (its FormatError; the reply is not kept in its history)
    "No tool calls found in the response. Every response MUST include at least one tool call.",
    "Missing 'command' argument in bash tool call.",
    "Error parsing tool call arguments:",  # inspect-ai writes the same of arguments it cannot parse
)
REJECTION = re.compile("|".join(map(re.escape, REJECTIONS)))


# How a harness ends an episode with its answer: a call to a tool of its own, recognised by the
# tool's name and the description the harness sends with it (and, where the tool is a general one,
# by the call's arguments), so an unrelated tool that happens to share the name is not misread.
# Where a harness has one, prose is never its answer: it rejects or nudges a reply without a call
# (smolagents cannot parse it, inspect-ai asks to "proceed to the next step", mini-swe-agent
# answers "No tool calls found"), and only the finishing call ends the task.
@dataclass(frozen=True, slots=True)
class Finisher:
    harness: str
    tool: str
    description: str  # how the description the harness sends starts
    protocol: str | None = None  # the prompt protocol it is offered under (None: a `tools` field)
    argument: tuple[str, re.Pattern] | None = None  # (parameter, pattern): only a call whose value matches finishes
    prompt: str | None = None  # text the harness always writes into the request beside the tool
    reads_text: bool = False  # the harness parses a call the stack left in the reply text itself


FINISHERS = (
    # its model parses a JSON call out of the text when the stack sent none (parse_json_tool_call)
    Finisher(
        "smolagents ToolCallingAgent", "final_answer", "Provides a final answer to the given problem.", reads_text=True
    ),
    Finisher("smolagents CodeAgent", "final_answer", "Provides a final answer to the given problem.", protocol="code"),
    Finisher("dspy ReAct", "finish", "Marks the task as complete.", protocol="dspy"),
    # react()'s default submit tool; the answer is the call's argument
    Finisher("inspect-ai react", "submit", "Submit an answer for evaluation."),
    # 2.x: the environment ends the task when a command's output starts with the marker line
    # (LocalEnvironment._check_finished); the prompt tells the model to `echo` it
    Finisher(
        "mini-swe-agent",
        "bash",
        "Execute a bash command",
        argument=("command", re.compile(r"\s*echo\s+[\"']?COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT(?![\w])")),
        prompt="COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    ),
)
_BY_TOOL: dict[tuple[str | None, str], list[Finisher]] = {}
for _f in FINISHERS:
    _BY_TOOL.setdefault((_f.protocol, _f.tool), []).append(_f)


def rejects(texts) -> bool:
    """Whether any of these texts (a request's messages after its last assistant message) is a
    harness saying it could not use the reply before them."""
    return any(REJECTION.search(t) is not None for t in texts if t)


def finisher(protocol: str | None, tools, messages=()) -> Finisher | None:
    """The finishing tool among these tools (in any wire family's shape, as the request offers them
    under `protocol`), if a harness's own is there. `messages`: the request's, for a finisher known
    only with its harness's words in the prompt beside it."""
    for tool in tools or ():
        spec = tool.get("function") if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else tool
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            continue
        description = spec.get("description")
        for f in _BY_TOOL.get((protocol, spec["name"]), ()):
            if (
                isinstance(description, str)
                and description.strip().startswith(f.description)
                and (f.prompt is None or _mentions(messages, f.prompt))
            ):
                return f
    return None


def _mentions(messages, text: str) -> bool:
    """Whether a message's content (a string, or parts with text) holds `text`."""
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            value = part.get("text") if isinstance(part, dict) else part
            if isinstance(value, str) and text in value:
                return True
    return False


def finishes(f: Finisher | None, calls, in_text: bool) -> bool:
    """Whether a reply calling exactly these tools ((name, arguments) pairs) ends the episode as
    the answer, under the harness's finisher `f`. `in_text`: the calls were left in the reply text
    (the harness got prose), so only a harness that reads calls out of text itself got them."""
    if f is None or not calls or (in_text and f.protocol is None and not f.reads_text):
        return False
    for name, arguments in calls:
        if name != f.tool:
            return False
        if f.argument is not None:
            value = arguments.get(f.argument[0]) if isinstance(arguments, dict) else None
            if not isinstance(value, str) or f.argument[1].match(value) is None:
                return False
    return True


# How a harness starts a subagent: a call to a tool of its own whose argument is the child
# conversation's task, which the child's first user message holds word for word (the child's
# answer comes back as the call's result). A conversation that opens with the exact text of such a
# call's argument, after the call was delivered, is that call's child (analysis.episodes.links).
@dataclass(frozen=True, slots=True)
class Spawner:
    harness: str
    tool: str
    argument: str  # the call's argument that holds the child's task


SPAWNERS = (
    # the Agent tool (Task before 2.1): {"description", "prompt", "subagent_type"}; the child's
    # request carries `cc_is_subagent=true` in its billing block
    Spawner("Claude Code 2.1.197", "Agent", "prompt"),
    Spawner("Claude Code (before 2.1)", "Task", "prompt"),
    Spawner("opencode 1.18.33", "task", "prompt"),  # a child session (session.parent_id), its result <task_result>
    Spawner("Qwen Code 0.15.10", "agent", "prompt"),
    Spawner("Codex 0.171.0", "spawn_agent", "message"),  # the multi_agent_v1 namespace: "Initial plain-text task"
)
_SPAWN_ARGUMENT = {s.tool: s.argument for s in SPAWNERS}


def spawned(tool_calls, key) -> list[str] | None:
    """ "KEY CALL_ID" of each delivered call (wire tool calls: name, arguments, id) that starts a
    subagent, KEY being `key` of the child's task; None when there is none."""
    out = []
    for tc in tool_calls or ():
        argument = _SPAWN_ARGUMENT.get(tc.name)
        if argument is None or not isinstance(tc.id, str) or not tc.id:
            continue
        args = tc.arguments_object()
        task = args.get(argument) if isinstance(args, dict) else None
        if isinstance(task, str) and (k := key(task)):
            out.append(f"{k} {tc.id}")
    return out or None
