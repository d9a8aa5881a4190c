"""constrained: decoding held to a JSON schema of "call one offered tool" or "give a final answer".

The schema goes to the stack in the field that stack reads, because a field a stack does not know is often
accepted and silently ignored (vLLM's `guided_json` since v0.12), which would turn the arm into
an unconstrained one without anyone noticing:

- Ollama `/api/chat`, on ollama: `format: <schema>`;
- `/v1/chat/completions`, on openai, lmstudio, llamacpp, vllm, sglang, ollama and unknown stacks:
  `response_format: {type: json_schema, json_schema: {name, schema}}`;
- `/v1/responses`, on openai, llamacpp and ollama: `text.format: {type: json_schema, name, schema}`;
- `/v1/messages`, on vllm: `output_config.format: {type: json_schema, schema}`;
- Gemini `:generateContent`, on a server that speaks it: `generationConfig.responseJsonSchema`
  with `responseMimeType: application/json` (the rest of the client's generationConfig kept);
- `/v1/messages` on any other stack (llama.cpp, SGLang, unknown): skipped, with that reason recorded.

`response_format` json_schema is the one field every OpenAI-compatible stack enforces (Ollama's
/v1 maps it to `format`, llama.cpp turns it into a grammar, vLLM and SGLang into structured
outputs). No `strict`: it demands closed schemas on OpenAI's API that real tool schemas rarely are.

The schema offers one branch per tool (`name` fixed to that tool, `arguments` its parameter
schema) plus `{"final_answer": string}` so the model can stop; `--constrained-forced` drops the
final answer for the original study's call-every-turn variant.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from toolproxy import wire
from toolproxy.conditions import ConditionOptions, Plan, Reject, RequestView, Skip
from toolproxy.conditions.messages import ChatRequest, history_as_text, read_chat_request, with_system_text
from toolproxy.conditions.text import chat_reply, without_tools
from toolproxy.conditions.toolblock import (
    FINAL_ANSWER,
    arguments_value,
    dumps,
    format_result,
    render_constrained_block,
    tool_functions,
)
from toolproxy.conditions.transform import new_call, text_calls

SCHEMA_NAME = "tool_call_or_final_answer"
# Whatever the client asked to constrain its reply with is replaced by the call schema.
SCHEMA_FIELDS = ("response_format", "format", "json_schema", "grammar", "guided_json", "text", "output_config")
# Gemini's generationConfig fields that hold a reply schema: replaced by the condition's.
GEMINI_SCHEMA = ("responseMimeType", "responseSchema", "responseJsonSchema")
# Stacks known to enforce Messages' output_config.format (vLLM maps it to structured outputs).
MESSAGES_SCHEMA_STACKS = frozenset({"vllm"})


def messages_skip(stack: str | None) -> Skip:
    return Skip(
        f"on /v1/messages a JSON schema rides in output_config.format, which only vLLM is known to enforce "
        f"(this upstream: {stack or 'not identified'}); use the chat completions or Responses endpoint, "
        "or serve --bridge messages, for the constrained condition"
    )


def call_schema(tools: list[Any], *, forced: bool = False) -> dict[str, Any]:
    branches = []
    for fn in tool_functions(tools):
        params = (
            fn.get("parameters")
            if isinstance(fn.get("parameters"), dict) and fn.get("parameters")
            else {"type": "object"}
        )
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [fn["name"]]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not forced:
        branches.append(
            {
                "type": "object",
                "properties": {FINAL_ANSWER: {"type": "string"}},
                "required": [FINAL_ANSWER],
                "additionalProperties": False,
            }
        )
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def constraint_fields(family: str, schema: dict[str, Any], body: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request fields that carry the schema (table above: the endpoint decides, and on
    /v1/messages only vLLM is known to enforce it); `body`: the request they go into, whose other
    generation settings a Gemini body keeps beside the schema."""
    if family == wire.GEMINI:
        generation = (body or {}).get("generationConfig")
        kept = {k: v for k, v in (generation if isinstance(generation, dict) else {}).items() if k not in GEMINI_SCHEMA}
        return {"generationConfig": {**kept, "responseMimeType": "application/json", "responseJsonSchema": schema}}
    if family == wire.OLLAMA_CHAT:
        return {"format": schema}
    if family == wire.MESSAGES:
        return {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    if family == wire.RESPONSES:
        return {"text": {"format": {"type": "json_schema", "name": SCHEMA_NAME, "schema": schema}}}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": schema}}}


def call_json(name: str, arguments: Any) -> str:
    """An earlier call in the history, shown in the shape the schema makes the model write."""
    return dumps({"name": name, "arguments": arguments_value(arguments)})


def required_tools(tools: list[Any], tool_choice: Any, forced: bool) -> tuple[list[Any], bool]:
    """(tools the schema offers, whether it must call one), honouring the harness's tool_choice:
    "required" leaves no final answer, a named function leaves only that tool."""
    if tool_choice == "required":
        return tools, True
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        named = [t for t in tools if isinstance(t, dict) and (t.get("function") or {}).get("name") == name]
        if named:
            return named, True
    return tools, forced


class ConstrainedReply:
    """Buffers the (short, schema-shaped) reply and reads the call or the final answer out of it."""

    def __init__(self, tool_names: tuple[str, ...]) -> None:
        self.tool_names = tool_names
        self.parts: list[str] = []
        self.note: str | None = None

    def feed(self, text: str) -> str:
        self.parts.append(text)
        return ""

    def finish(self) -> tuple[str, list[wire.Call]]:
        text = "".join(self.parts)
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]:
            args = arguments_value(obj.get("arguments", {}))
            if isinstance(args, dict):
                self.note = "schema reply: tool call"
                return "", [new_call(obj["name"], json.dumps(args, ensure_ascii=False))]
        if isinstance(obj, dict) and FINAL_ANSWER in obj:
            self.note = "schema reply: final answer"
            answer = obj[FINAL_ANSWER]
            return answer if isinstance(answer, str) else dumps(answer), []
        # The stack did not enforce the schema (or the reply was cut off): recover what text parsing can.
        content, calls = text_calls(text, tool_names=self.tool_names, formats=None)
        self.note = f"reply did not follow the schema; {len(calls)} call(s) recovered from text"
        return content, calls


class Constrained:
    name = "constrained"

    def prepare(self, request: RequestView, options: ConditionOptions) -> Plan | Skip | Reject:
        chat = read_chat_request(request, bridge=options.bridge)
        if not isinstance(chat, ChatRequest):
            return chat
        if chat.sent_family == wire.MESSAGES and options.stack not in MESSAGES_SCHEMA_STACKS:
            return messages_skip(options.stack)
        tools, forced = required_tools(chat.tools, chat.request.tool_choice, options.constrained_forced)
        block = render_constrained_block(tools, forced=forced)
        messages = with_system_text(history_as_text(chat.messages, call_json, format_result), block)
        body = without_tools(chat, messages, drop=SCHEMA_FIELDS)
        body.update(constraint_fields(chat.sent_family, call_schema(tools, forced=forced), body))
        transform = chat_reply(chat, ConstrainedReply(tuple(wire.tool_names(chat.tools))))
        return Plan(path=chat.upstream_path(request), body=orjson.dumps(body), transform=transform)


CONDITION = Constrained()
