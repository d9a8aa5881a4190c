"""Google Gemini (`models/MODEL:generateContent`, `:streamGenerateContent`, `:countTokens`): the
request as a chat conversation, replies read from each GenerateContentResponse, and replies
written the way the Gemini API writes them.

The wire format, as Google documents it (https://ai.google.dev/api/generate-content,
https://ai.google.dev/api/caching#Content, https://ai.google.dev/api/tokens):

- The model and the streaming mode are in the path, not the body: `POST
  /v1beta/models/gemini-2.5-flash:generateContent` answers one GenerateContentResponse;
  `:streamGenerateContent?alt=sse` answers Server-Sent Events, each `data:` one
  GenerateContentResponse (no `[DONE]`: the stream ends with the connection);
  `:streamGenerateContent` without `alt=sse` answers one JSON array of them, written element by
  element (`[{...}\\n,\\r\\n{...}\\n]`). `:countTokens` answers `{"totalTokens": N}`.
- Request: `contents` (a list of Content: `role` "user" or "model", `parts`), `systemInstruction`
  (a Content), `tools` (`functionDeclarations`: name, description, `parameters` in the API's
  OpenAPI subset, types spelled `OBJECT`/`STRING`..., or `parametersJsonSchema`), `toolConfig.
  functionCallingConfig` (`mode` AUTO, ANY, NONE, VALIDATED; `allowedFunctionNames`),
  `generationConfig` (temperature, topP, maxOutputTokens, stopSequences, responseMimeType with
  responseSchema or responseJsonSchema, thinkingConfig).
- A Part is one of `text` (with `thought: true` for the model's thinking), `functionCall` {name,
  args object, optional id}, `functionResponse` {name, response object, optional id},
  `inlineData`, `fileData`, ...; a part may carry a `thoughtSignature`.
- Reply: `candidates[]` (`content`, `finishReason`: STOP, MAX_TOKENS, SAFETY, RECITATION,
  LANGUAGE, OTHER, BLOCKLIST, PROHIBITED_CONTENT, SPII, MALFORMED_FUNCTION_CALL,
  UNEXPECTED_TOOL_CALL, TOO_MANY_TOOL_CALLS, ...), `promptFeedback.blockReason` when the prompt
  itself was blocked, `usageMetadata` (promptTokenCount, candidatesTokenCount, thoughtsTokenCount,
  cachedContentTokenCount, totalTokenCount), `modelVersion`, `responseId`. A call arrives whole,
  in one part of one chunk; finishReason is STOP whether or not the turn holds calls.
- Errors: `{"error": {"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}`, also as an
  element of a stream.

Function calls carry no id in most of the API's replies, and function responses are matched to
their call by name and order; chat needs ids on both sides, so a call without one gets a stable
id from its place in the conversation (`call_<content>_<part>`), and a response without one the
id of the earliest open call of its name.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import unquote

import orjson

from .model import (
    BufferingEncoder,
    Call,
    CallArguments,
    CallEnd,
    CallStart,
    Error,
    Event,
    Finish,
    Reasoning,
    Request,
    Text,
    Usage,
    leading_system,
    message_calls,
    text_of,
)

GENERATE = ":generateContent"
STREAM = ":streamGenerateContent"
COUNT_TOKENS = ":countTokens"

# finishReason -> the chat-completions word. STOP is "stop", or "tool_calls" when the reply holds calls.
FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
_GEMINI_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
_STATUS_NAMES |= {408: "DEADLINE_EXCEEDED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED"}
_STATUS_NAMES |= {
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_PARAMS = {"temperature": "temperature", "topP": "top_p", "maxOutputTokens": "max_tokens", "seed": "seed"}
_PARAMS |= {"presencePenalty": "presence_penalty", "frequencyPenalty": "frequency_penalty"}


def method_of(path: str) -> str | None:
    """`:generateContent`, `:streamGenerateContent` or `:countTokens` when the path ends in one."""
    p = path.split("?", 1)[0].rstrip("/")
    for method in (GENERATE, STREAM, COUNT_TOKENS):
        if p.endswith(method):
            return method
    return None


def model_of(path: str) -> str | None:
    """The model a Gemini path names (`.../models/gemini-2.5-flash:generateContent` ->
    `gemini-2.5-flash`; a tuned model `tunedModels/x` keeps its collection)."""
    p = unquote(path.split("?", 1)[0].rstrip("/"))
    name, sep, _ = p.rpartition(":")
    if not sep:
        return None
    for collection in ("/models/", "/tunedModels/"):
        if collection in name:
            model = name.rsplit(collection, 1)[1]
            return (model if collection == "/models/" else collection.strip("/") + "/" + model) or None
    return None


def with_model(path: str, model: str) -> str:
    """The Gemini path naming another model (`.../models/OLD:method` -> `.../models/NEW:method`)."""
    head, sep, method = path.rpartition(":")
    if not sep or "/models/" not in head:
        return path
    return head.rsplit("/models/", 1)[0] + "/models/" + model + ":" + method


def sibling_path(path: str, route: str) -> str:
    """`route` (e.g. `/v1/chat/completions`) under whatever prefix comes before the Gemini path's
    API version (`/v1beta`, `/v1`, ...): where a bridged Gemini request goes."""
    segments = path.split("?", 1)[0].split("/")
    for i, segment in enumerate(segments):
        if segment.startswith("v1"):
            return "/".join(segments[:i]) + route
    return route


def _usage(meta: Any) -> Usage | None:
    if not isinstance(meta, dict):
        return None

    def count(key: str) -> int | None:
        value = meta.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    prompt, candidates, thoughts = count("promptTokenCount"), count("candidatesTokenCount"), count("thoughtsTokenCount")
    completion = None if candidates is None and thoughts is None else (candidates or 0) + (thoughts or 0)
    if prompt is None and completion is None:
        return None
    return Usage(prompt, completion, count("cachedContentTokenCount"))


def finish_reason(reason: str, has_calls: bool) -> str:
    """A Gemini finishReason in chat-completions words (an unknown one kept, lower-cased: the
    server's own verdict, e.g. `malformed_function_call`, is worth more than a guess)."""
    mapped = FINISH_REASONS.get(reason)
    if mapped == "stop" and has_calls:
        return "tool_calls"
    return mapped or reason.lower()


class GeminiReader:
    """One GenerateContentResponse (a whole reply, or one chunk of a stream) -> events. Only the
    first candidate counts, the one a harness acts on."""

    def __init__(self) -> None:
        self.n_calls = 0
        self.n_choices = 0

    def read(self, name: str | None, obj: dict) -> list[Event]:
        out: list[Event] = []
        candidates = obj.get("candidates")
        if isinstance(candidates, list) and candidates:
            self.n_choices = max(self.n_choices, len(candidates))
            first = candidates[0] if isinstance(candidates[0], dict) else {}
            content = first.get("content") if isinstance(first.get("content"), dict) else {}
            for part in content.get("parts") if isinstance(content.get("parts"), list) else ():
                if isinstance(part, dict):
                    out += self._part(part)
            u = _usage(obj.get("usageMetadata"))
            if u is not None:
                out.append(u)
            reason = first.get("finishReason")
            if isinstance(reason, str) and reason and reason != "FINISH_REASON_UNSPECIFIED":
                out.append(Finish(finish_reason(reason, self.n_calls > 0)))
            return out
        feedback = obj.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            self.n_choices = max(self.n_choices, 1)
            return [Error(f"the prompt was blocked: {feedback['blockReason']}")]
        u = _usage(obj.get("usageMetadata"))
        if u is not None:
            out.append(u)  # a last chunk may carry only the usage
        return out

    def _part(self, part: dict) -> list[Event]:
        text = part.get("text")
        if isinstance(text, str):
            if not text:
                return []
            return [Reasoning(text)] if part.get("thought") is True else [Text(text)]
        call = part.get("functionCall")
        if isinstance(call, dict):
            index = self.n_calls
            self.n_calls += 1
            cid = call.get("id") if isinstance(call.get("id"), str) else None
            name = call.get("name") if isinstance(call.get("name"), str) else None
            args = call.get("args")
            return [CallStart(index, cid, name), CallArguments(index, {} if args is None else args), CallEnd(index)]
        return []


def _schema(value: Any) -> Any:
    """The API's OpenAPI-subset schema as JSON Schema: type names lower-cased (`OBJECT` ->
    `object`), `nullable` as a null type, everything else as given. Applied to the JSON-Schema
    fields too (`parametersJsonSchema`, `responseJsonSchema`): Gemini CLI writes `OBJECT` there,
    which the API accepts and a JSON Schema validator (or llama.cpp's grammar) would not."""
    if isinstance(value, list):
        return [_schema(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, v in value.items():
        if key == "type" and isinstance(v, str):
            out[key] = v.lower()
        elif key in ("properties", "$defs", "definitions") and isinstance(v, dict):
            out[key] = {name: _schema(s) for name, s in v.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "not", "additionalProperties", "prefixItems"):
            out[key] = _schema(v)
        elif key != "nullable":
            out[key] = v
    if value.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _parts(content: Any) -> list[dict]:
    if not isinstance(content, dict):
        return []
    parts = content.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def _response_text(response: Any) -> str:
    """A function response's `response` object as the text a chat tool message holds: its
    `output` (or `content`) when that is its one field of text, else the object's JSON."""
    if isinstance(response, dict) and len(response) == 1:
        (only,) = response.values()
        if isinstance(only, str):
            return only
    return response if isinstance(response, str) else orjson.dumps(response).decode()


def read_request(body: dict[str, Any], path: str = "") -> Request:
    messages: list[Any] = []
    system = text_of_parts(_parts(body.get("systemInstruction")))
    if system:
        messages.append({"role": "system", "content": system})
    open_calls: list[tuple[str, str]] = []  # (name, id) of calls not yet answered, oldest first
    contents = body.get("contents")
    for n, content in enumerate(contents if isinstance(contents, list) else ()):
        if not isinstance(content, dict):
            continue
        role = "assistant" if content.get("role") == "model" else "user"
        parts = _parts(content)
        text = "".join(p["text"] for p in parts if isinstance(p.get("text"), str) and p.get("thought") is not True)
        calls = []
        for i, part in enumerate(parts):
            fn = part.get("functionCall")
            if isinstance(fn, dict):
                cid = fn.get("id") if isinstance(fn.get("id"), str) and fn["id"] else f"call_{n}_{i}"
                name = fn.get("name")
                open_calls.append((name, cid))
                args = fn.get("args")
                calls.append(
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": name, "arguments": orjson.dumps({} if args is None else args).decode()},
                    }
                )
        for part in parts:
            fr = part.get("functionResponse")
            if isinstance(fr, dict):
                cid = fr.get("id") if isinstance(fr.get("id"), str) and fr["id"] else None
                match = next((c for c in open_calls if (c[1] == cid if cid else c[0] == fr.get("name"))), None)
                if match is not None:
                    open_calls.remove(match)
                    cid = match[1]
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": cid or f"call_{n}_{fr.get('name')}",
                        "name": fr.get("name"),
                        "content": _response_text(fr.get("response")),
                    }
                )
        if calls:
            messages.append({"role": role, "content": text or None, "tool_calls": calls})
        elif text or not any("functionResponse" in p for p in parts):
            messages.append({"role": role, "content": text})
    tools = []
    for tool in body.get("tools") if isinstance(body.get("tools"), list) else ():
        declarations = tool.get("functionDeclarations") if isinstance(tool, dict) else None
        for decl in declarations if isinstance(declarations, list) else ():
            if isinstance(decl, dict) and isinstance(decl.get("name"), str):
                fn: dict[str, Any] = {"name": decl["name"]}
                if "description" in decl:
                    fn["description"] = decl["description"]
                if isinstance(decl.get("parametersJsonSchema"), dict):
                    fn["parameters"] = _schema(decl["parametersJsonSchema"])
                elif isinstance(decl.get("parameters"), dict):
                    fn["parameters"] = _schema(decl["parameters"])
                else:
                    fn["parameters"] = {"type": "object", "properties": {}}
                tools.append({"type": "function", "function": fn})
    config = body.get("toolConfig") if isinstance(body.get("toolConfig"), dict) else {}
    calling = config.get("functionCallingConfig") if isinstance(config.get("functionCallingConfig"), dict) else {}
    choice: Any = {"AUTO": "auto", "VALIDATED": "auto", "ANY": "required", "NONE": "none"}.get(calling.get("mode"))
    allowed = calling.get("allowedFunctionNames")
    if choice == "required" and isinstance(allowed, list) and len(allowed) == 1:
        choice = {"type": "function", "function": {"name": allowed[0]}}
    generation = body.get("generationConfig") if isinstance(body.get("generationConfig"), dict) else {}
    params = {chat: generation[key] for key, chat in _PARAMS.items() if key in generation}
    if "stopSequences" in generation:
        params["stop"] = generation["stopSequences"]
    schema = generation.get("responseJsonSchema", generation.get("responseSchema"))
    if isinstance(schema, dict):
        params["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": _schema(schema)},
        }
    elif generation.get("responseMimeType") == "application/json":
        params["response_format"] = {"type": "json_object"}
    return Request(
        "gemini",
        messages,
        tools,
        choice,
        method_of(path) == STREAM,
        model_of(path),
        params,
        body,
    )


def text_of_parts(parts: list[dict]) -> str:
    """The text of parts (thoughts left out)."""
    return "".join(p["text"] for p in parts if isinstance(p.get("text"), str) and p.get("thought") is not True)


def write_request(request: Request) -> dict[str, Any]:
    """A Gemini body for the request: the original's own fields kept, the conversation (tool
    results as functionResponse parts of a user turn, calls as functionCall parts), tools and
    tool choice written from it."""
    body = {k: v for k, v in request.body.items() if k not in ("contents", "systemInstruction", "tools", "toolConfig")}
    system, messages = leading_system(request.messages)
    if system is not None:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    names: dict[str, str] = {}
    contents: list[dict] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        parts: list[dict] = []
        if msg.get("role") == "tool":
            role = "user"
            name = msg.get("name") or names.get(msg.get("tool_call_id") or "")
            parts.append(
                {
                    "functionResponse": {
                        "id": msg.get("tool_call_id"),
                        "name": name,
                        "response": {"output": text_of(msg.get("content"))},
                    }
                }
            )
        else:
            role = "model" if msg.get("role") == "assistant" else "user"
            if text_of(msg.get("content")):
                parts.append({"text": text_of(msg.get("content"))})
        for call in message_calls(msg):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            c = Call(0, call.get("id"), fn.get("name"), fn.get("arguments"))
            names[c.id or ""] = c.name or ""
            args = c.arguments_object()
            call_part = {"name": c.name, "args": args if isinstance(args, dict) else {}}
            parts.append({"functionCall": {"id": c.id, **call_part} if c.id else call_part})
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    body["contents"] = contents
    if request.tools:
        body["tools"] = [
            {
                "functionDeclarations": [
                    {
                        "name": fn.get("name"),
                        "description": fn.get("description", ""),
                        "parametersJsonSchema": fn.get("parameters") or {"type": "object"},
                    }
                    for fn in (t.get("function") or {} for t in request.tools)
                ]
            }
        ]
    choice = request.tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    elif choice in ("auto", "none", "required"):
        body["toolConfig"] = {"functionCallingConfig": {"mode": {"required": "ANY"}.get(choice, choice.upper())}}
    fmt = request.parameters.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        generation = body.get("generationConfig") if isinstance(body.get("generationConfig"), dict) else {}
        body["generationConfig"] = {
            **{k: v for k, v in generation.items() if k != "responseSchema"},
            "responseMimeType": "application/json",
            "responseJsonSchema": (fmt.get("json_schema") or {}).get("schema"),
        }
    return body


def count_request(body: dict[str, Any], path: str = "") -> Request:
    """A countTokens body as the conversation it counts: its `contents`, or the whole
    `generateContentRequest` it may hold instead (then with that request's system text and tools)."""
    inner = body.get("generateContentRequest")
    return read_request(inner if isinstance(inner, dict) else body, path)


def count_reply(total: int) -> bytes:
    return orjson.dumps({"totalTokens": total, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": total}]})


def error_body(message: str, code: int = 500) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": _STATUS_NAMES.get(code, "UNKNOWN")}}


class GeminiEncoder(BufferingEncoder):
    """A GenerateContentResponse, or a stream of them as the API writes it: Server-Sent Events
    (`alt=sse`) or one JSON array written element by element. Text streams as it comes; the calls,
    the finishReason and the usage come in the last chunk."""

    def __init__(self, *, model: str, stream: bool, sse: bool = True) -> None:
        super().__init__(model=model, stream=stream)
        self.sse = sse
        self.id = secrets.token_urlsafe(16)
        self.content_type = "text/event-stream" if stream and sse else "application/json; charset=UTF-8"
        self._chunks = 0

    def _response(self, parts: list[dict], finish: str | None, usage: dict | None) -> dict:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
        if finish is not None:
            candidate["finishReason"] = finish
        candidate["index"] = 0
        out: dict[str, Any] = {"candidates": [candidate]}
        if usage is not None:
            prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            meta = {
                "promptTokenCount": prompt,
                "candidatesTokenCount": completion,
                "totalTokenCount": prompt + completion,
            }
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            if cached:
                meta["cachedContentTokenCount"] = cached
            out["usageMetadata"] = meta
        out["modelVersion"] = self.model
        out["responseId"] = self.id
        return out

    def _write(self, obj: dict) -> bytes:
        data = orjson.dumps(obj)
        if not self.stream:
            return data
        if self.sse:
            return b"data: " + data + b"\r\n\r\n"
        self._chunks += 1
        return (b"[" if self._chunks == 1 else b"\n,\r\n") + data

    def _stream_delta(self, text: str) -> bytes:
        return self._write(self._response([{"text": text}], None, None))

    def error(self, message: str) -> bytes:
        out = self._write(error_body(message))
        return out + b"\n]" if self.stream and not self.sse else out

    def end(self, tail: str, calls: list[Call], finish_reason: str | None, usage: dict | None) -> bytes:
        finish = _GEMINI_FINISH.get(finish_reason or "stop", "STOP")
        call_parts = []
        for call in calls:
            args = call.arguments_object()
            fn: dict[str, Any] = {"name": call.name, "args": args if isinstance(args, dict) else {}}
            if call.id:
                fn["id"] = call.id
            call_parts.append({"functionCall": fn})
        if not self.stream:
            text = "".join(self._text) + tail
            return self._write(self._response(([{"text": text}] if text else []) + call_parts, finish, usage))
        parts = ([{"text": tail}] if tail else []) + call_parts
        out = self._write(self._response(parts or [{"text": ""}], finish, usage))
        return out + (b"" if self.sse else b"\n]")
