"""Reading a conversation request and rewriting its message list (shared by hint, text,
constrained, template).

Every protocol a harness may speak is accepted: OpenAI `/v1/chat/completions`, Ollama's native
`/api/chat`, OpenAI Responses, Anthropic Messages and Google Gemini. toolproxy.wire reads each
into chat terms (Ollama tool calls carry arguments as objects and no ids, and its tool results
name the tool; Responses, Messages and Gemini conversations become chat messages), the conditions
rewrite that one message list, and the body goes upstream in the client's own protocol again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

import toolproxy.wire.gemini as wire_gemini
from toolproxy import wire
from toolproxy.conditions import Reject, RequestView, Skip
from toolproxy.conditions.toolblock import tool_functions

REWRITABLE_FAMILIES = (wire.CHAT, wire.OLLAMA_CHAT, wire.RESPONSES, wire.MESSAGES, wire.GEMINI)
PATHS = {
    wire.CHAT: "/v1/chat/completions",
    wire.OLLAMA_CHAT: "/api/chat",
    wire.RESPONSES: "/v1/responses",
    wire.MESSAGES: "/v1/messages",
    wire.GEMINI: "/v1beta/models/MODEL:generateContent",
}
# Where each protocol keeps its conversation, and the JSON type it must have there.
CONVERSATION = {wire.RESPONSES: ("input", (list, str)), wire.GEMINI: ("contents", list)}
# Where a protocol other than chat keeps its system text.
SYSTEM_FIELD = {wire.RESPONSES: "instructions", wire.MESSAGES: "system", wire.GEMINI: "systemInstruction"}
# Fields that would make the stack render or parse tools itself, in any protocol.
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")


@dataclass(slots=True)
class ChatRequest:
    family: str  # the wire family the client spoke
    body: dict[str, Any]  # as the client sent it
    request: wire.Request  # the same in chat terms
    sent_family: str  # the family sent upstream: the client's own, or chat when bridged
    query: str = ""  # the client's query string (Gemini asks for SSE there: `alt=sse`)

    @property
    def bridged(self) -> bool:
        return self.sent_family != self.family

    @property
    def stream(self) -> bool:
        return self.request.stream

    @property
    def tools(self) -> list[Any]:
        return self.request.tools

    @property
    def messages(self) -> list[Any]:
        return self.request.messages

    def upstream_body(self, messages: list[Any], *, keep_tools: bool, drop: tuple[str, ...] = ()) -> dict[str, Any]:
        """The client's body in its own protocol, with this message list (and without the tool
        fields unless `keep_tools`, and without the fields in `drop`)."""
        gone = set(drop) | (set() if keep_tools else set(TOOL_FIELDS))
        base = {k: v for k, v in self.body.items() if k not in gone}
        if self.family in (wire.CHAT, wire.OLLAMA_CHAT):
            return {**base, "messages": messages}
        tools = self.request.tools if keep_tools else []
        choice = self.request.tool_choice if keep_tools else None
        params = {k: v for k, v in self.request.parameters.items() if k not in drop}
        request = replace(
            self.request, messages=messages, tools=tools, tool_choice=choice, parameters=params, body=base
        )
        return wire.write_request(self.sent_family, request)

    def with_system_block(self, block: str) -> dict[str, Any]:
        """The client's body with `block` added to its system text and nothing else changed (a
        Responses body's `instructions`, a Messages body's `system`, a chat system message), so
        content the chat terms do not carry (images, cache_control, reasoning items) survives."""
        if self.bridged or self.family in (wire.CHAT, wire.OLLAMA_CHAT):
            return self.upstream_body(with_system_text(self.messages, block), keep_tools=True)
        key = SYSTEM_FIELD[self.family]
        current = self.body.get(key)
        if self.family == wire.GEMINI:
            parts = current.get("parts") if isinstance(current, dict) else None
            parts = parts if isinstance(parts, list) else []
            text = "\n\n" + block if parts else block
            return {
                **self.body,
                key: {**(current if isinstance(current, dict) else {}), "parts": [*parts, {"text": text}]},
            }
        if isinstance(current, list):
            return {**self.body, key: [*current, {"type": "text", "text": "\n\n" + block}]}
        existing = current if isinstance(current, str) else ""
        return {**self.body, key: f"{existing}\n\n{block}" if existing else block}

    def upstream_path(self, request: RequestView) -> str:
        """Where the body goes: the client's path, or its chat completions sibling when bridged."""
        if not self.bridged:
            return upstream_path(request)
        if self.family == wire.GEMINI:
            # the query (`alt=sse`, a `key`) is Gemini's: a chat completions path takes none
            return wire_gemini.sibling_path(request.path, "/v1/chat/completions")
        base = request.path.rstrip("/").rsplit("/", 1)[0]
        return upstream_path(request, base + "/chat/completions")


def read_chat_request(
    request: RequestView, *, need_tools: bool = True, families=REWRITABLE_FAMILIES, bridge: frozenset[str] = frozenset()
) -> ChatRequest | Skip | Reject:
    """The request as a ChatRequest, or a Skip that says why the condition cannot apply to it.
    A family in `bridge` is sent upstream as chat completions; a Reject when that cannot carry it."""
    family = wire.family_of(request.path)
    if request.method != "POST" or family not in families:
        wanted = " or ".join(PATHS[f] for f in families)
        return Skip(f"{request.method} {request.path} is not a conversation request ({wanted})")
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        return Skip(f"request body is not JSON ({exc})")
    conversation, kinds = CONVERSATION.get(family, ("messages", list))
    if not isinstance(body, dict) or not isinstance(body.get(conversation), kinds):
        return Skip(f"request body has no '{conversation}' list")
    read = wire.read_request(family, body, request.path)
    chat = ChatRequest(family, body, read, wire.CHAT if family in bridge else family, request.query)
    if chat.bridged and chat.request.parameters.get("previous_response_id"):
        return Reject(
            400,
            "previous_response_id names a response stored by the server, but this toolproxy bridges "
            "Responses to a chat-only upstream that stores nothing: send the whole conversation as input",
        )
    if need_tools and not tool_functions(chat.tools):
        return Skip("request offers no function tools")
    if need_tools and chat.request.tool_choice == "none":
        return Skip("tool_choice is 'none': the harness asked for no tool call")
    return chat


def with_system_text(messages: list[Any], block: str) -> list[Any]:
    """Messages with `block` appended to the leading system (or developer) message, created if absent."""
    out = list(messages)
    first = out[0] if out and isinstance(out[0], dict) else None
    if first is not None and first.get("role") in ("system", "developer"):
        content = first.get("content")
        if isinstance(content, list):
            new_content: Any = [*content, {"type": "text", "text": "\n\n" + block}]
        else:
            existing = wire.text_of(content)
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
            parts = [wire.text_of(msg.get("content"))] if wire.text_of(msg.get("content")) else []
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
            text = result_text(call_id, name, wire.text_of(msg.get("content")))
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
