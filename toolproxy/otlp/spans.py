"""A recorded exchange -> one span, in the OpenTelemetry GenAI semantic conventions. Pure: no I/O.

The span describes the exchange as the harness made it: a CLIENT span named "{operation} {model}"
(e.g. "chat qwen2.5-coder") with the request's model and sampling parameters, the reply's model,
id, finish reason and token usage read from the recorded bodies by the same wire decoders the
analyzer uses, `error.type` when the exchange failed, and toolproxy's own attributes (exchange id,
run, episode, item, condition, statuses, time to first byte). Each tool call the harness received
is a span event with the registry's `gen_ai.tool.*` attributes. Message content (prompts, replies,
tool arguments, tool definitions) is sensitive and large, so, as the conventions ask, it is left
out unless asked for (`content=True`), and then cut at CONTENT_CHARS per text.

Ids are derived, not random: the span id from the exchange id, the trace id from the run and
episode tags (so one tagged episode is one trace) or else from the exchange id. Sending the same
recording twice gives the same ids, so a receiver can tell repeats apart. The analysed span of an
exchange (`toolproxy export --otlp`) has a span id of its own, since receivers keep the first span
they get under an id, and links to the live one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import orjson
from yarl import URL

from toolproxy.record.model import body_bytes
from toolproxy.wire.decode import decode
from toolproxy.wire.endpoints import COMPLETION, MESSAGES, OLLAMA_CHAT, OLLAMA_GENERATE, family_of
from toolproxy.wire.model import Reply, Request, message_calls, text_of
from toolproxy.wire.requests import read_request

CONTENT_CHARS = 16_384
TAG_CHARS = 1_024

_OPERATIONS = {COMPLETION: "text_completion", OLLAMA_GENERATE: "text_completion"}
# gen_ai.provider.name names the API flavour spoken (the registry's words); the serving stack
# behind it, when known, is toolproxy.stack.
_PROVIDERS = {MESSAGES: "anthropic", OLLAMA_CHAT: "ollama", OLLAMA_GENERATE: "ollama"}
# request body key -> attribute; the first key present wins for the same attribute.
_PARAMETERS = (
    ("temperature", "gen_ai.request.temperature", float),
    ("top_p", "gen_ai.request.top_p", float),
    ("top_k", "gen_ai.request.top_k", float),
    ("frequency_penalty", "gen_ai.request.frequency_penalty", float),
    ("presence_penalty", "gen_ai.request.presence_penalty", float),
    ("seed", "gen_ai.request.seed", int),
    ("max_completion_tokens", "gen_ai.request.max_tokens", int),
    ("max_tokens", "gen_ai.request.max_tokens", int),
    ("max_output_tokens", "gen_ai.request.max_tokens", int),
    ("num_predict", "gen_ai.request.max_tokens", int),
)
_SPILLED = "toolproxy-spilled-"  # a body the writer streamed from a temporary file is not in the record any more


@dataclass(slots=True)
class SpanData:
    """A finished span as plain data (the exporter turns it into the SDK's type)."""

    name: str
    trace_id: int
    span_id: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    # The status description when the exchange ended in an error; None leaves the status unset.
    error: str | None = None
    # (trace id, span id) of related spans: an analysed span links to the live span of its exchange.
    links: list[tuple[int, int]] = field(default_factory=list)


def span_of(
    rec: dict,
    *,
    content: bool = False,
    stack: str | None = None,
    extra: dict[str, Any] | None = None,
    calls: list[dict] | None = None,
) -> SpanData:
    """The span for one exchange record (a dict as written to the segments).

    `extra` adds attributes (the analyzer's classification, for `toolproxy export --otlp`);
    `calls`, when given, are the tool calls to show as events instead of those in the reply
    (the analyzer's, which include calls it found written in the text, with their verdicts).
    """
    g = rec.get
    family = family_of(_text(g("path")) or "") if g("method", "POST") == "POST" else None
    start_ns = _ns(g("started_at")) or 0
    end_ns = _ns(g("ended_at")) or start_ns + int((_number(g("duration_ms")) or 0) * 1e6)
    attrs: dict[str, Any] = {}
    events: list[tuple[str, int, dict[str, Any]]] = []
    upstream = URL(_text(g("upstream")) or "")
    if upstream.host:
        attrs["server.address"] = upstream.host
        attrs["server.port"] = upstream.port
    status = g("status") if isinstance(g("status"), int) else None
    if status is not None:
        attrs["http.response.status_code"] = status

    if family is None:
        name = f"{_text(g('method')) or 'HTTP'} {_text(g('path')) or '/'}"[:200]
        attrs["http.request.method"] = _text(g("method")) or ""
        reply = None
    else:
        request = _request(rec, family)
        operation = _OPERATIONS.get(family, "chat")
        model = request.model if request is not None and isinstance(request.model, str) and request.model else None
        name = f"{operation} {model}" if model else operation
        attrs["gen_ai.operation.name"] = operation
        attrs["gen_ai.provider.name"] = _PROVIDERS.get(family, "openai")
        if model:
            attrs["gen_ai.request.model"] = _text(model)
        if request is not None:
            attrs.update(_parameters(request.body, family))
        reply = _reply(rec, family)
        streamed = reply.streamed or (request is not None and request.stream)
        if streamed:
            attrs["gen_ai.request.stream"] = True
            if _number(g("ttfb_ms")) is not None:
                attrs["gen_ai.response.time_to_first_chunk"] = g("ttfb_ms") / 1000
        attrs.update(_reply_attributes(reply))
        if calls is None:
            calls = [{"index": c.index, "id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
        else:  # the analyzer's calls do not keep the call id the reply gave a structured call
            ids = {(c.index, c.name): c.id for c in reply.tool_calls}
            calls = [{**c, "id": c.get("id") or ids.get((c.get("index"), c.get("name")))} for c in calls]
        events = [_call_event(call, end_ns, content) for call in calls]
        if content:
            attrs.update(_content(request, reply))

    error_type, error = _error(rec, status, reply)
    if error_type is not None:
        attrs["error.type"] = error_type
    attrs.update(_own(rec, stack))
    for key, value in (extra or {}).items():
        if value is not None:
            attrs[key] = _text(value)[:TAG_CHARS] if isinstance(value, str) else value
    return SpanData(
        name=_text(name),
        trace_id=trace_id_of(rec),
        span_id=span_id_of(_text(g("id")) or ""),
        start_ns=start_ns,
        end_ns=max(end_ns, start_ns),
        attributes=attrs,
        events=events,
        error=error,
    )


def trace_id_of(rec: dict) -> int:
    """One trace per tagged episode (run and episode), else one per exchange."""
    episode = rec.get("episode")
    key = f"episode\0{rec.get('run') or ''}\0{episode}" if episode else f"exchange\0{rec.get('id')}"
    return _hash(key, 16)


def span_id_of(exchange_id: str) -> int:
    return _hash(exchange_id, 8)


def as_analysed(span: SpanData, exchange_id: str) -> SpanData:
    """The span re-identified as the exchange's analysed span, linked to its live one (same trace)."""
    span.links = [(span.trace_id, span.span_id)]
    span.span_id = _hash(f"analysed\0{exchange_id}", 8)
    return span


def _hash(key: str, size: int) -> int:
    value = int.from_bytes(hashlib.blake2b(_text(key).encode(), digest_size=size).digest(), "big")
    return value or 1  # an all-zero id is invalid in OTLP


def _request(rec: dict, family: str) -> Request | None:
    raw = _body(rec, "request_body")
    if raw is None:
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    try:
        return read_request(family, body, _text(rec.get("path")) or "")
    except Exception:  # noqa: BLE001 - a request the readers choke on still gets its span, without details
        return Request(
            family=family,
            messages=[],
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            body=body,
        )


def _reply(rec: dict, family: str) -> Reply:
    """The reply the harness received: the client's body when a condition rewrote it, else the upstream's."""
    field_name = "client_body" if rec.get("client_body") is not None else "response_body"
    headers = rec.get("response_headers") if field_name == "response_body" else None
    encoding = _header(headers, "content-encoding")
    if encoding and encoding.strip().lower() != "identity":
        return Reply()  # compressed on the wire: the analyzer inflates it; a span goes without its details
    return decode(_body(rec, field_name), family, _header(headers, "content-type"))


def _body(rec: dict, name: str) -> bytes | None:
    text = rec.get(name)
    if not isinstance(text, str) or text.startswith(_SPILLED):
        return None
    try:
        return body_bytes(text, rec.get(f"{name}_encoding"))
    except ValueError:
        return None


def _header(headers: Any, name: str) -> str | None:
    for pair in headers or ():
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and str(pair[0]).lower() == name:
            return str(pair[1])
    return None


def _parameters(body: dict, family: str) -> dict[str, Any]:
    options = body.get("options") if family in (OLLAMA_CHAT, OLLAMA_GENERATE) else None
    merged = {**options, **body} if isinstance(options, dict) else body
    out: dict[str, Any] = {}
    for key, attribute, kind in _PARAMETERS:
        value = merged.get(key)
        if attribute not in out and isinstance(value, (int, float)) and not isinstance(value, bool):
            if kind is float or float(value).is_integer():
                out[attribute] = kind(value)
    stop = merged.get("stop") if "stop" in merged else merged.get("stop_sequences")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        out["gen_ai.request.stop_sequences"] = [_text(s) for s in stop]
    n = merged.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n != 1:
        out["gen_ai.request.choice.count"] = n
    return out


def _reply_attributes(reply: Reply) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(reply.model, str) and reply.model:
        out["gen_ai.response.model"] = _text(reply.model)
    if isinstance(reply.id, str) and reply.id:
        out["gen_ai.response.id"] = _text(reply.id)
    if isinstance(reply.finish_reason, str) and reply.finish_reason:
        out["gen_ai.response.finish_reasons"] = [_text(reply.finish_reason)]
    for attribute, value in (
        ("gen_ai.usage.input_tokens", reply.prompt_tokens),
        ("gen_ai.usage.output_tokens", reply.completion_tokens),
        ("gen_ai.usage.cache_read.input_tokens", reply.cached_tokens),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            out[attribute] = value
    return out


def _call_event(call: dict, at_ns: int, content: bool) -> tuple[str, int, dict[str, Any]]:
    """A tool call the reply carried: name and id always; arguments only with content."""
    attrs: dict[str, Any] = {"gen_ai.tool.type": "function", "toolproxy.call.index": call.get("index") or 0}
    name = call.get("name")
    attrs["gen_ai.tool.name"] = _text(name)[:TAG_CHARS] if isinstance(name, str) else ""
    if isinstance(call.get("id"), str) and call["id"]:
        attrs["gen_ai.tool.call.id"] = _text(call["id"])[:TAG_CHARS]
    for key in ("surface", "format"):
        if isinstance(call.get(key), str):
            attrs[f"toolproxy.call.{key}"] = call[key]
    for key in ("offered", "valid"):
        if isinstance(call.get(key), bool):
            attrs[f"toolproxy.call.{key}"] = call[key]
    if content:
        attrs["gen_ai.tool.call.arguments"] = _cut(_arguments_text(call.get("arguments")))
    return "toolproxy.tool_call", at_ns, attrs


def _content(request: Request | None, reply: Reply) -> dict[str, Any]:
    """The opt-in content attributes, as JSON strings in the conventions' message shapes."""
    out: dict[str, Any] = {}
    if request is not None:
        out["gen_ai.input.messages"] = _json([_message_parts(m) for m in request.messages if isinstance(m, dict)])
        if request.tools:
            out["gen_ai.tool.definitions"] = _json([_tool_definition(t) for t in request.tools if isinstance(t, dict)])
    parts: list[dict] = []
    if reply.content:
        parts.append({"type": "text", "content": _cut(reply.content)})
    for call in reply.tool_calls:
        parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": _arguments(call.arguments)})
    if parts or reply.finish_reason:
        out["gen_ai.output.messages"] = _json(
            [{"role": "assistant", "parts": parts, "finish_reason": reply.finish_reason or ""}]
        )
    return out


def _message_parts(msg: dict) -> dict:
    role = msg.get("role") if isinstance(msg.get("role"), str) else "user"
    text = text_of(msg.get("content")) if not isinstance(msg.get("content"), (int, float)) else str(msg["content"])
    parts: list[dict] = []
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": msg.get("tool_call_id"), "response": _cut(text)})
    else:
        if text:
            parts.append({"type": "text", "content": _cut(text)})
        for call in message_calls(msg):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": fn.get("name"),
                    "arguments": _arguments(fn.get("arguments")),
                }
            )
    return {"role": role, "parts": parts}


def _tool_definition(tool: dict) -> dict:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return {
        "type": tool.get("type") or "function",
        "name": fn.get("name"),
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
    }


def _arguments(value: Any) -> Any:
    """Arguments as an object where they are JSON (the conventions ask for one), else the text, cut."""
    if isinstance(value, str):
        try:
            return orjson.loads(value) if len(value) <= CONTENT_CHARS else _cut(value)
        except orjson.JSONDecodeError:
            return _cut(value)
    return value


def _arguments_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _json(value)


def _error(rec: dict, status: int | None, reply: Reply | None) -> tuple[str | None, str | None]:
    """(error.type, status description): the proxy's error kind, else the HTTP status, else an
    error the upstream sent inside a successful stream."""
    kind, message = rec.get("error_kind"), rec.get("error_message")
    if isinstance(kind, str) and kind:
        return _text(kind), _text(message if isinstance(message, str) else kind)[:TAG_CHARS]
    shown = rec.get("client_status") if isinstance(rec.get("client_status"), int) else status
    if shown is not None and shown >= 400:
        detail = reply.error if reply is not None and reply.error else f"HTTP {shown}"
        return str(shown), _text(detail)[:TAG_CHARS]
    if reply is not None and reply.error:
        return "upstream_error", _text(reply.error)[:TAG_CHARS]
    return None, None


def _own(rec: dict, stack: str | None) -> dict[str, Any]:
    g = rec.get
    out: dict[str, Any] = {
        "toolproxy.exchange_id": _text(g("id")) or "",
        "toolproxy.condition": _text(g("condition")) or "native",
        "toolproxy.path": _text(g("path"))[:TAG_CHARS] if g("path") else "",
    }
    for key in ("run", "episode", "item"):
        if isinstance(g(key), str) and g(key):
            out[f"toolproxy.{key}"] = _text(g(key))[:TAG_CHARS]
    if isinstance(g("client_status"), int) and g("client_status") != g("status"):
        out["toolproxy.client_status"] = g("client_status")
    for key in ("ttfb_ms", "duration_ms", "pool_wait_ms"):
        if _number(g(key)) is not None:
            out[f"toolproxy.{key}"] = float(g(key))
    if g("condition_note"):
        out["toolproxy.condition_note"] = _text(str(g("condition_note")))[:TAG_CHARS]
    if stack:
        out["toolproxy.stack"] = _text(stack)
    return out


def _ns(seconds: Any) -> int | None:
    """Epoch seconds (a float: microseconds are all it holds exactly) -> nanoseconds."""
    return round(seconds * 1e6) * 1000 if _number(seconds) is not None else None


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str:
    """A string OTLP can carry: a lone surrogate (aiohttp hands odd header bytes over as them) becomes "?"."""
    if not isinstance(value, str):
        return "" if value is None else str(value)
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")


def _cut(text: str) -> str:
    text = _text(text)
    return text if len(text) <= CONTENT_CHARS else text[:CONTENT_CHARS] + f"... ({len(text):,} characters in all)"


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:  # a lone surrogate somewhere in a hostile body: escaped, still valid JSON
        return json.dumps(value, default=str)
