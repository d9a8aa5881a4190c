"""Side requests: what a harness asks for itself beside the task, known by what they are.

A coding agent sends requests of its own beside the task it was given: a title for the session,
a summary of the conversation when it compacts it, a pass over its memory files, a label for what
a tool did, a commit message, a token count, the model list, a connection warm-up. Each is recorded
and stored like any exchange, but is no turn of the task: counted as one it would be an episode of
its own (a title request opens and ends one) or, continuing the task's conversation with a message
of its own (Qwen Code's memory pass, Claude Code's compaction), make the task's last answer look
like a turn that was nudged. Each side request is known here by its exact shape as the agent's
source writes it (the endpoint, the method, a prompt it always sends), never by a guess: a plain
user task never starts with these words, and one that is not recognised is left a turn (and the
report says how many requests it could not place).

One table, SIDES; add an agent's requests here with where its source writes them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# What each kind of side request is for, in words (the report and the live page show the kind).
KINDS = {
    "title": "a title for the session",
    "summary": "a summary of the conversation (compaction)",
    "memory": "a pass over the agent's memory files",
    "recap": "a recap for a user who comes back",
    "label": "a label for what a step or a tool did",
    "suggestion": "a guess at the user's next prompt",
    "commit_message": "a commit message",
    "routing": "a choice of model for the request",
    "next_speaker": "whether the model or the user speaks next",
    "token_count": "a token count",
    "model_list": "the list of models",
    "health": "a health check",
    "probe": "what the server supports",
    "prewarm": "a connection warm-up",
}


@dataclass(frozen=True, slots=True)
class Carry:
    """How the task's next request carries a summary this side request returned (compaction): the
    part of the reply that is the summary (between `reply_from` and `reply_to`, or all of it), and
    where a later request writes it: after `marker` (and then after `start`, when given), up to
    `until`. The two are matched whitespace-insensitively, by a hash of the summary (text_key)."""

    marker: str
    start: str | None = None
    until: str | None = None
    reply_from: str | None = None
    reply_to: str | None = None


@dataclass(frozen=True, slots=True)
class Side:
    kind: str
    harness: str  # who sends it (the version its source was read at)
    where: str  # where that source writes it
    method: str = "POST"
    path: str | None = None  # the exact path (model requests: any model endpoint when None)
    system_starts: str | None = None  # the system prompt (system and developer messages) starts with
    system_has: str | None = None  # ... or holds
    user_starts: str | None = None  # the last user message's text starts with
    user_has: str | None = None  # ... or holds
    only_user: str | None = None  # the request's one message is a user message of exactly this text
    no_tools: bool = False  # the request offers no tools
    fields: tuple[tuple[str, Any], ...] = ()  # body fields it always has, exactly
    only_fields: frozenset[str] | None = None  # and no fields but these (probes)
    carry: Carry | None = None  # a summary the task goes on from (compaction)


_CLAUDE = "Claude Code 2.1.197"
_CLAUDE_SRC = "the claude-code binary's bundled cli"  # (minified: each entry names its querySource)
# formatCompactSummary: the reply's <analysis> dropped, its <summary> written after "Summary:"
_CLAUDE_SUMMARY = Carry(
    marker="This session is being continued from a previous conversation that ran out of context.",
    start="Summary:",
    until="\n\nIf you need specific details",
    reply_from="<summary>",
    reply_to="</summary>",
)

SIDES: tuple[Side, ...] = (
    # -- Claude Code
    Side(
        "title",
        _CLAUDE,
        f"{_CLAUDE_SRC}: generateSessionTitle (querySource generate_session_title)",
        system_has="Generate a concise, sentence-case title (3-7 words) that captures the main topic or goal of this "
        "coding session.",
        no_tools=True,
    ),
    # the compaction request is the task's conversation (same system prompt and tools, for the prompt
    # cache) plus this message; the task then goes on from the summary (_CLAUDE_SUMMARY)
    Side(
        "summary",
        _CLAUDE,
        f"{_CLAUDE_SRC}: the compact prompt (querySource compact, reactive-compact)",
        user_has="Your task is to create a detailed summary of the conversation so far, paying close attention to "
        "the user's explicit requests and your previous actions.",
        carry=_CLAUDE_SUMMARY,
    ),
    Side(
        "memory",
        _CLAUDE,
        f"{_CLAUDE_SRC}: extractMemories (querySource extract_memories)",
        user_starts="You are now acting as the memory extraction subagent.",
    ),
    Side(
        "recap",
        _CLAUDE,
        f"{_CLAUDE_SRC}: the away summary (querySource away_summary)",
        user_starts="The user stepped away and is coming back. Recap in under 40 words",
    ),
    Side(
        "label",
        _CLAUDE,
        f"{_CLAUDE_SRC}: a subagent's progress line (querySource agent_summary)",
        user_starts="Describe your most recent action in 3-5 words using present tense (-ing).",
    ),
    Side(
        "label",
        _CLAUDE,
        f"{_CLAUDE_SRC}: a label for completed tools (querySource tool_use_summary_generation)",
        system_has="Write a short summary label describing what these tool calls accomplished.",
        no_tools=True,
    ),
    Side(
        "suggestion",
        _CLAUDE,
        f"{_CLAUDE_SRC}: the prompt suggestion (querySource prompt_suggestion)",
        user_starts="[SUGGESTION MODE: Suggest what the user might naturally type next into Claude Code.]",
    ),
    Side(
        "probe",
        _CLAUDE,
        f"{_CLAUDE_SRC}: a model name's validation (querySource model_validation)",
        only_user="Hi",
        fields=(("max_tokens", 1),),
        no_tools=True,
    ),
    # fetch(ANTHROPIC_BASE_URL, {method: "HEAD"}) at start, to open the connection early
    Side("prewarm", _CLAUDE, f"{_CLAUDE_SRC}: the preconnect HEAD of the base URL", method="HEAD", path="/"),
    # -- Anthropic's and OpenAI's APIs, as every client of them uses them
    Side(
        "token_count",
        "Anthropic Messages clients",
        "the Messages API's count_tokens endpoint",
        path="/v1/messages/count_tokens",
    ),
    Side("model_list", "OpenAI-compatible clients", "the models endpoint", method="GET", path="/v1/models"),
    Side("model_list", "OpenAI-compatible clients", "the models endpoint", method="GET", path="/models"),
    Side("model_list", "Ollama clients", "Ollama's model list", method="GET", path="/api/tags"),
    Side("health", "llama.cpp clients", "llama-server's health endpoint", method="GET", path="/health"),
    Side("health", "llama.cpp clients", "llama-server's health endpoint", method="GET", path="/v1/health"),
    Side("probe", "llama.cpp clients", "llama-server's properties", method="GET", path="/props"),
    Side("probe", "Ollama clients", "Ollama's version", method="GET", path="/api/version"),
    # -- Codex 0.171.0 (codex-rs/core/templates/compact/prompt.md, summary_prefix.md): the local
    # compaction of a provider without the remote one; the task goes on from the summary
    Side(
        "summary",
        "Codex 0.171.0",
        "codex-rs/core/templates/compact/prompt.md",
        user_starts="You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM",
        carry=Carry(
            marker="Here is the summary produced by the other language model, use the information in this "
            "summary to assist with your own analysis:"
        ),
    ),
    # -- opencode 1.18.33 (packages/opencode/src/agent/prompt/title.txt, compaction.txt)
    Side(
        "title",
        "opencode 1.18.33",
        "the title agent's prompt (agent/prompt/title.txt)",
        system_starts="You are a title generator. You output ONLY a thread title. Nothing else.",
        no_tools=True,
    ),
    Side(
        "summary",
        "opencode 1.18.33",
        "the compaction agent's prompt (agent/prompt/compaction.txt)",
        system_starts="You are a context summarization agent. You are given a conversation between a user and an "
        "agent.",
    ),
    # -- Qwen Code 0.15.10 (packages/core/src/...)
    Side(
        "memory",
        "Qwen Code 0.15.10",
        "memory/extractionAgentPlanner.ts: EXTRACTION_AGENT_SYSTEM_PROMPT",
        system_starts="You are now acting as the managed memory extraction subagent for an AI coding assistant.",
    ),
    Side(
        "memory",
        "Qwen Code 0.15.10",
        "memory/dream: DREAM_AGENT_SYSTEM_PROMPT",
        system_starts="You are performing a managed memory dream",
    ),
    Side(
        "title",
        "Qwen Code 0.15.10",
        "services/sessionTitle.ts: TITLE_SYSTEM_PROMPT",
        system_starts="Generate a concise, sentence-case title (3-7 words) that captures what this "
        "programming-assistant session is about.",
        no_tools=True,
    ),
    Side(
        "summary",
        "Qwen Code 0.15.10",
        "core/prompts.ts: getCompressionPrompt()",
        system_has="You are the component that summarizes internal chat history into a given structure.",
    ),
    # Gemini CLI 0.61 writes the same check (utils/nextSpeakerChecker.ts: CHECK_PROMPT)
    Side(
        "next_speaker",
        "Qwen Code 0.15.10, Gemini CLI 0.61",
        "utils/nextSpeakerChecker.ts: CHECK_PROMPT",
        user_starts="Analyze *only* the content and structure of your immediately preceding response",
    ),
    # -- Gemini CLI 0.61 (bundle)
    Side(
        "routing",
        "Gemini CLI 0.61",
        "routing/strategies/classifierStrategy.ts: the classifier prompt",
        system_starts="You are a specialized Task Routing AI.",
    ),
    Side(
        "summary",
        "Gemini CLI 0.61",
        "the chat compression prompt",
        system_has="You are generating a highly factual state summary to preserve the agent's exact working context.",
    ),
    # -- aider 0.86.2 (aider/prompts.py)
    Side(
        "commit_message",
        "aider 0.86.2",
        "aider/prompts.py: commit_system",
        system_starts="You are an expert software engineer that generates concise, one-line Git commit messages",
        no_tools=True,
    ),
    Side(
        "summary",
        "aider 0.86.2",
        "aider/prompts.py: summarize (aider/history.py: ChatSummary)",
        system_starts="*Briefly* summarize this partial conversation about programming.",
        no_tools=True,
        carry=Carry(marker="I spoke to you previously about a number of things.\n"),
    ),
    # -- inspect-ai (inspect_ai/model/_providers/openai.py, OpenAIAPI.reasoning_summaries()): once
    # per provider, before the first Responses request, whether the account may ask for reasoning
    # summaries
    Side(
        "probe",
        "inspect-ai 0.3.285",
        "inspect_ai/model/_providers/openai.py: reasoning_summaries()",
        path="/v1/responses",
        fields=(("input", "Please say 'hello, world'"), ("reasoning", {"effort": "low", "summary": "auto"})),
        only_fields=frozenset(("input", "reasoning", "model", "stream", "store", "metadata", "user")),
    ),
    # -- Codex CLI 0.171.0 on a Responses WebSocket: the turn's own request first sent with
    # generate: false, which the API answers with no output; the turn then chains to it by
    # previous_response_id (captured in tests/data/websocket)
    Side(
        "prewarm",
        "Codex CLI 0.171.0",
        "its WebSocket prewarm: a response.create with generate: false",
        path="/v1/responses",
        fields=(("generate", False),),
    ),
)

_SYSTEM_ROLES = frozenset(("system", "developer"))
_BY_METHOD: dict[str, list[Side]] = {}
for _s in SIDES:
    _BY_METHOD.setdefault(_s.method, []).append(_s)


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _reads(text: str, starts: str | None, has: str | None) -> bool:
    return (starts is None or text.startswith(starts)) and (has is None or has in text)


def _system(messages: Sequence[Any]) -> str:
    return "\n".join(
        text_of(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES
    ).strip()


def _last_user(messages: Sequence[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return text_of(m.get("content")).strip()
    return ""


def side_request(
    method: str | None, path: str | None, body: Any, messages: Sequence[Any] = (), tools: Sequence[Any] | None = None
) -> Side | None:
    """Which known side request this exchange is, or None for one of the task. `body`: the request
    as sent (a dict, or None); `messages` and `tools`: the same in chat terms (wire.read_request),
    so one entry holds for every protocol the agent may speak."""
    candidates = _BY_METHOD.get(method or "", ())
    system = user = None
    for s in candidates:
        if s.path is not None and s.path != path:
            continue
        if s.path is None and not messages:
            continue
        if s.no_tools and tools:
            continue
        if s.fields and not (isinstance(body, dict) and all(body.get(k) == v for k, v in s.fields)):
            continue
        if s.only_fields is not None and not (isinstance(body, dict) and set(body) <= s.only_fields):
            continue
        if s.system_starts is not None or s.system_has is not None:
            system = _system(messages) if system is None else system
            if not _reads(system, s.system_starts, s.system_has):
                continue
        if s.user_starts is not None or s.user_has is not None:
            user = _last_user(messages) if user is None else user
            if not _reads(user, s.user_starts, s.user_has):
                continue
        if s.only_user is not None:
            said = [m for m in messages if isinstance(m, dict) and m.get("role") not in _SYSTEM_ROLES]
            if (
                len(said) != 1
                or said[0].get("role") != "user"
                or text_of(said[0].get("content")).strip() != s.only_user
            ):
                continue
        return s
    return None


_SPACE = re.compile(r"\s+")


def text_key(text: str) -> str | None:
    """The key a summary is matched by: a hash of its words (whitespace does not count)."""
    words = _SPACE.sub(" ", text).strip()
    return hashlib.blake2b(words.encode(), digest_size=12).hexdigest() if words else None


def returned_summary(side: Side, reply: str | None) -> str | None:
    """The summary_key of what a summary side request returned, when the task goes on from it."""
    c = side.carry
    if c is None or not reply:
        return None
    if c.reply_from is not None and c.reply_from in reply:
        reply = reply.split(c.reply_from, 1)[1]
        if c.reply_to is not None:
            reply = reply.split(c.reply_to, 1)[0]
    return text_key(reply)


_CARRIES = tuple({s.carry for s in SIDES if s.carry is not None})


def carried_summary(messages: Sequence[Any]) -> str | None:
    """The summary_key of a summary this request's conversation goes on from (a compacted task's
    next request), or None. Only the messages before the first assistant message are read: the
    summary opens the compacted conversation."""
    for m in messages:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "assistant":
            return None
        if m.get("role") != "user":
            continue
        content = m.get("content")
        for text in (
            [content]
            if isinstance(content, str)
            else [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if isinstance(content, list)
            else []
        ):
            for c in _CARRIES:
                at = text.find(c.marker)
                if at < 0:
                    continue
                rest = text[at + len(c.marker) :]
                if c.start is not None:
                    if c.start not in rest:
                        continue
                    rest = rest.split(c.start, 1)[1]
                if c.until is not None:
                    rest = rest.split(c.until, 1)[0]
                return text_key(rest)
    return None


def opening_keys(body: Any) -> list[str] | None:
    """The text_key of each text the conversation opens with (every text part of its user messages
    before the first assistant message, as the request wrote them: a protocol's reading may join
    the parts), or None when it has an assistant message already: a subagent's conversation opens
    with the task its parent's call gave it (analysis.episodes.links)."""
    items = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(items, list):
        items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return None
    keys = []
    for m in items:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role == "assistant" or m.get("type") in ("function_call", "function_call_output"):
            return None
        if role != "user":
            continue
        content = m.get("content")
        texts = (
            [content]
            if isinstance(content, str)
            else [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if isinstance(content, list)
            else []
        )
        keys += [k for k in map(text_key, texts) if k]
    return keys or None
