"""Reading a chat request and rewriting its message list (shared by hint, text, constrained, template).

Both wire dialects a harness may speak are accepted: OpenAI `/v1/chat/completions` and Ollama's
native `/api/chat`. Their message lists differ only in details handled here: Ollama tool calls
carry arguments as objects and no ids, and its tool results name the tool (`tool_name`) instead
of pointing at a call id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import orjson

from toolproxy.conditions import RequestView, Skip
from toolproxy.conditions.toolblock import tool_functions

OPENAI = "openai"
OLLAMA = "ollama"


@dataclass(slots=True)
class ChatRequest:
    api: str  # OPENAI or OLLAMA
    body: dict[str, Any]

    @property
    def stream(self) -> bool:
        # Ollama's /api/chat streams unless told not to; OpenAI's endpoint only when asked.
        default = self.api == OLLAMA
        return bool(self.body.get("stream", default))

    @property
    def tools(self) -> list[Any]:
        tools = self.body.get("tools")
        return tools if isinstance(tools, list) else []

    @property
    def messages(self) -> list[Any]:
        return self.body["messages"]


def chat_api(path: str) -> str | None:
    if path.rstrip("/").endswith("/chat/completions"):
        return OPENAI
    if path.rstrip("/") == "/api/chat":
        return OLLAMA
    return None


def read_chat_request(request: RequestView, *, need_tools: bool = True, apis=(OPENAI, OLLAMA)) -> ChatRequest | Skip:
    """The request as a ChatRequest, or a Skip that says why the condition cannot apply to it."""
    api = chat_api(request.path)
    if request.method != "POST" or api not in apis:
        wanted = " or ".join({OPENAI: "/v1/chat/completions", OLLAMA: "/api/chat"}[a] for a in apis)
        return Skip(f"{request.method} {request.path} is not a chat request ({wanted})")
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        return Skip(f"request body is not JSON ({exc})")
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return Skip("request body has no 'messages' list")
    chat = ChatRequest(api, body)
    if need_tools and not tool_functions(chat.tools):
        return Skip("request offers no function tools")
    if need_tools and chat.body.get("tool_choice") == "none":
        return Skip("tool_choice is 'none': the harness asked for no tool call")
    return chat


def text_of(content: Any) -> str:
    """Plain text of a message content: a string, or OpenAI content parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def with_system_text(messages: list[Any], block: str) -> list[Any]:
    """Messages with `block` appended to the leading system (or developer) message, created if absent."""
    out = list(messages)
    first = out[0] if out and isinstance(out[0], dict) else None
    if first is not None and first.get("role") in ("system", "developer"):
        content = first.get("content")
        if isinstance(content, list):
            new_content: Any = [*content, {"type": "text", "text": "\n\n" + block}]
        else:
            existing = text_of(content)
            new_content = f"{existing}\n\n{block}" if existing else block
        out[0] = {**first, "content": new_content}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


CallText = Callable[[str, Any], str]
ResultText = Callable[[str | None, str | None, str], str]


def history_as_text(messages: list[Any], call_text: CallText, result_text: ResultText) -> list[Any]:
    """Messages a model without tool support can read.

    Assistant `tool_calls` become text in the taught format after the assistant's content, and
    `tool` messages become user messages holding the result with its call id and tool name.
    Consecutive results (parallel calls) share one user message so roles still alternate, which
    many chat templates insist on.
    """
    names_by_id: dict[str, str] = {}
    out: list[Any] = []
    merge_into_last = False
    for msg in messages:
        if not isinstance(msg, dict):
            out.append(msg)
            merge_into_last = False
            continue
        role = msg.get("role")
        if role == "assistant" and msg.get("tool_calls"):
            parts = [text_of(msg.get("content"))] if text_of(msg.get("content")) else []
            for call in msg["tool_calls"]:
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                name = fn.get("name") or ""
                if isinstance(call, dict) and call.get("id"):
                    names_by_id[call["id"]] = name
                parts.append(call_text(name, fn.get("arguments", {})))
            rewritten = {k: v for k, v in msg.items() if k not in ("tool_calls", "function_call")}
            rewritten["content"] = "\n".join(parts)
            out.append(rewritten)
            merge_into_last = False
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            name = msg.get("name") or msg.get("tool_name") or names_by_id.get(call_id or "")
            text = result_text(call_id, name, text_of(msg.get("content")))
            if merge_into_last:
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": "user", "content": text})
            merge_into_last = True
        else:
            out.append(msg)
            merge_into_last = False
    return out


def upstream_path(request: RequestView, path: str | None = None) -> str:
    """The path (and the client's query string) a Plan sends to."""
    path = request.path if path is None else path
    return path + ("?" + request.query if request.query else "")
