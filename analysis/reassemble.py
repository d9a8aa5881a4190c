"""Raw response bytes -> the one message the harness ended up with.

Streams are stored as the raw event text the stack sent (SPEC section 3), so every dialect is put
back together here, after the fact, the way a client library would: OpenAI SSE deltas (content,
reasoning, tool_call fragments merged by index with argument strings concatenated, the usage
chunk), Ollama NDJSON (/api/chat, /api/generate), text completions (/v1/completions, llama.cpp
/completion). Non-streamed bodies go through the same accumulators, so one code path decides what
a message contains. Streams cut short yield what arrived plus `complete=False`; nothing here raises
on bad input, because a recording of a broken exchange is exactly what the analyzer must explain.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson

from toolproxy.record.model import body_bytes

# endpoint families, by path suffix
CHAT = "chat"
COMPLETION = "completion"
OLLAMA_CHAT = "ollama_chat"
OLLAMA_GENERATE = "ollama_generate"

_ENDPOINTS = (
    ("/chat/completions", CHAT),
    ("/api/chat", OLLAMA_CHAT),
    ("/api/generate", OLLAMA_GENERATE),
    ("/completions", COMPLETION),
    ("/completion", COMPLETION),
)


def endpoint_kind(path: str) -> str | None:
    """The completion family a request path belongs to; None for anything that is not an attempt."""
    p = path.rstrip("/")
    for suffix, kind in _ENDPOINTS:
        if p.endswith(suffix):
            return kind
    return None


@dataclass(slots=True)
class ToolCall:
    index: int
    id: str | None = None
    name: str | None = None
    # A JSON string as OpenAI sends it, or an object as Ollama native (and some llama.cpp builds) do.
    arguments: Any = None


@dataclass(slots=True)
class Reply:
    streamed: bool = False
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    n_choices: int = 0
    complete: bool = False
    error: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # Why the body could not be read at all (not JSON, unknown encoding, ...); None if it could.
    unreadable: str | None = None
    # The start of an unreadable body, so a plain-text error page can still be read and judged.
    raw_text: str | None = None
    empty_body: bool = False
    # First and last JSON objects seen: what stack-marker detection looks at.
    first: dict | None = None
    last: dict | None = None

    @property
    def has_output(self) -> bool:
        return bool(self.tool_calls) or bool(self.content and self.content.strip()) or bool(
            self.reasoning_content and self.reasoning_content.strip()
        )


def header(headers: Iterable, name: str) -> str | None:
    """A header value from the record's [name, value] pairs (first one wins)."""
    lname = name.lower()
    for pair in headers or ():
        if len(pair) == 2 and pair[0].lower() == lname:
            return pair[1]
    return None


def decode_body(text: str | None, encoding: str | None, content_encoding: str | None = None) -> tuple[bytes | None, str | None]:
    """(plain bytes, problem). Compressed bodies are inflated; a truncated gzip stream gives what it can."""
    try:
        raw = body_bytes(text, encoding)
    except (ValueError, TypeError) as exc:
        return None, f"body is not valid {encoding}: {exc}"
    if raw is None or not content_encoding:
        return raw, None
    ce = content_encoding.strip().lower()
    if ce in ("", "identity"):
        return raw, None
    if ce in ("gzip", "x-gzip", "deflate"):
        for wbits in ((zlib.MAX_WBITS | 16,) if ce != "deflate" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)):
            d = zlib.decompressobj(wbits)
            try:
                return d.decompress(raw) + d.flush(), None
            except zlib.error as exc:
                problem = f"cannot inflate {ce} body: {exc}"
        return None, problem
    return None, f"content-encoding {ce!r} is not supported by the analyzer"


def reassemble(raw: bytes | None, kind: str | None, content_type: str | None = None) -> Reply:
    """The message in a response body of the given endpoint family (see endpoint_kind)."""
    reply = Reply()
    if raw is None or not raw.strip():
        reply.empty_body = True
        return reply
    ct = (content_type or "").lower()
    stripped = raw.lstrip()
    if "text/event-stream" in ct or stripped[:5] in (b"data:", b"event", b"id: ", b": pin") or stripped[:1] == b":":
        reply.streamed = True
        objects = _sse_objects(raw, reply)
    elif "ndjson" in ct or (kind in (OLLAMA_CHAT, OLLAMA_GENERATE) and b"\n" in raw.strip()):
        reply.streamed = True
        objects = _ndjson_objects(raw)
    else:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            reply.unreadable = f"body is not JSON: {exc}"
            reply.raw_text = raw[:4000].decode("utf-8", "replace")
            return reply
        objects = [obj]
        reply.complete = True
    feed = _FEEDERS.get(kind, _feed_openai)
    for obj in objects:
        if not isinstance(obj, dict):
            if reply.unreadable is None and not reply.streamed:
                reply.unreadable = f"body is JSON but not an object ({type(obj).__name__})"
            continue
        if reply.first is None:
            reply.first = obj
        reply.last = obj
        err = _error_of(obj)
        if err is not None:
            reply.error = err
            continue
        feed(reply, obj)
    return reply


def _sse_objects(raw: bytes, reply: Reply) -> list:
    """JSON payloads of an SSE body; `[DONE]` marks the stream complete."""
    payloads = []
    data: list[bytes] = []
    for line in raw.split(b"\n") + [b""]:
        if line.startswith(b"data:"):
            data.append(line[5:].strip())
            continue
        if line.strip() or not data:
            continue
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        data = []
        if payload == b"[DONE]":
            reply.complete = True
        elif payload:
            payloads.append(payload)
    return _json_many(payloads)


def _json_many(payloads: list[bytes]) -> list:
    """Parse many small JSON documents in one C call (a stream has hundreds); fall back to one
    by one when any is bad, e.g. a last event torn by a cut stream, which is dropped as a client
    library would."""
    try:
        return orjson.loads(b"[" + b",".join(payloads) + b"]")
    except orjson.JSONDecodeError:
        out = []
        for p in payloads:
            try:
                out.append(orjson.loads(p))
            except orjson.JSONDecodeError:
                continue
        return out


def _ndjson_objects(raw: bytes) -> list:
    return _json_many([line for line in raw.split(b"\n") if line.strip()])


def _error_of(obj: dict) -> str | None:
    """The message of an error object in any stack's shape, else None."""
    err = obj.get("error")
    if err is not None and not obj.get("choices"):
        if isinstance(err, dict):
            return str(err.get("message") or orjson.dumps(err).decode())
        return str(err)
    if obj.get("object") == "error":
        return str(obj.get("message") or "")
    if "detail" in obj and len(obj) <= 2 and "choices" not in obj:
        detail = obj["detail"]
        return detail if isinstance(detail, str) else orjson.dumps(detail).decode()
    return None


def _usage(reply: Reply, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    reply.prompt_tokens = usage.get("prompt_tokens", reply.prompt_tokens)
    reply.completion_tokens = usage.get("completion_tokens", reply.completion_tokens)
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        reply.cached_tokens = details["cached_tokens"]


def _append(current: str | None, piece: Any) -> str | None:
    if piece is None or piece == "":
        return current
    if not isinstance(piece, str):
        piece = orjson.dumps(piece).decode()
    return piece if current is None else current + piece


def _merge_tool_deltas(reply: Reply, deltas: Any) -> None:
    """Merge OpenAI tool_call deltas: by `index`; argument fragments concatenate in order.

    Some servers omit `index` (older Ollama sends each call whole): then a new `id` opens a new
    call, and an id-less fragment continues the last one.
    """
    if not isinstance(deltas, list):
        return
    calls = reply.tool_calls
    for pos, d in enumerate(deltas):
        if not isinstance(d, dict):
            continue
        idx = d.get("index")
        call = None
        if isinstance(idx, int):
            call = next((c for c in calls if c.index == idx), None)
        else:
            cid = d.get("id")
            if cid is not None:
                call = next((c for c in calls if c.id == cid), None)
            elif calls:
                call = calls[-1]
            idx = len(calls) if call is None else call.index
        if call is None:
            call = ToolCall(index=idx)
            calls.append(call)
        if d.get("id") and call.id is None:
            call.id = d["id"]
        fn = d.get("function") if isinstance(d.get("function"), dict) else {}
        name = fn.get("name")
        if name and call.name is None:
            call.name = name
        args = fn.get("arguments")
        if isinstance(args, str):
            if isinstance(call.arguments, str):
                call.arguments += args
            elif call.arguments is None:
                call.arguments = args
        elif args is not None:
            call.arguments = args
    calls.sort(key=lambda c: c.index)


def _feed_openai(reply: Reply, obj: dict) -> None:
    # Called once per stream chunk (hundreds per reply): the common delta path does as few
    # lookups as it can; rare fields are only looked at when present.
    if reply.model is None and isinstance(obj.get("model"), str):
        reply.model = obj["model"]
    if obj.get("usage") is not None:
        _usage(reply, obj["usage"])
    if "timings" in obj:
        timings = obj["timings"]
        if reply.cached_tokens is None and isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
            reply.cached_tokens = timings["cache_n"]
    choices = obj.get("choices")
    if not isinstance(choices, list):
        if isinstance(obj.get("content"), str):  # llama.cpp /completion
            _feed_llamacpp_completion(reply, obj)
        return
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        idx = choice.get("index", 0)
        if isinstance(idx, int) and idx >= reply.n_choices:
            reply.n_choices = idx + 1
        if idx not in (0, None):
            continue  # n > 1: the harness acts on the first choice
        msg = choice.get("delta")
        if not isinstance(msg, dict):
            msg = choice.get("message")
        if isinstance(msg, dict):
            piece = msg.get("content")
            if piece:
                reply.content = _append(reply.content, piece)
            reasoning = msg.get("reasoning_content") or msg.get("reasoning")
            if reasoning:
                reply.reasoning_content = _append(reply.reasoning_content, reasoning)
            if msg.get("tool_calls"):
                _merge_tool_deltas(reply, msg["tool_calls"])
            if isinstance(msg.get("function_call"), dict):
                _merge_tool_deltas(reply, [{"index": 0, "function": msg["function_call"]}])
        if isinstance(choice.get("text"), str):
            reply.content = _append(reply.content, choice["text"])
        if choice.get("finish_reason"):
            reply.finish_reason = choice["finish_reason"]
            reply.complete = True


def _feed_llamacpp_completion(reply: Reply, obj: dict) -> None:
    reply.n_choices = max(reply.n_choices, 1)
    reply.content = _append(reply.content, obj.get("content"))
    if obj.get("stop"):
        reply.complete = True
        stop_type = obj.get("stop_type")
        reply.finish_reason = "length" if stop_type == "limit" else "stop"
        if obj.get("truncated") and reply.finish_reason == "stop":
            reply.finish_reason = "length"
    if isinstance(obj.get("tokens_evaluated"), int):
        reply.prompt_tokens = obj["tokens_evaluated"]
    if isinstance(obj.get("tokens_predicted"), int):
        reply.completion_tokens = obj["tokens_predicted"]
    timings = obj.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        reply.cached_tokens = timings["cache_n"]


def _feed_ollama(reply: Reply, obj: dict) -> None:
    if reply.model is None and isinstance(obj.get("model"), str):
        reply.model = obj["model"]
    if "choices" in obj:  # an OpenAI-shaped body on an Ollama path (a proxy in between)
        _feed_openai(reply, obj)
        return
    reply.n_choices = 1
    msg = obj.get("message")
    if isinstance(msg, dict):
        reply.content = _append(reply.content, msg.get("content"))
        reply.reasoning_content = _append(reply.reasoning_content, msg.get("thinking"))
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            for c in calls:
                if isinstance(c, dict):
                    fn = c.get("function") if isinstance(c.get("function"), dict) else {}
                    reply.tool_calls.append(
                        ToolCall(index=len(reply.tool_calls), id=c.get("id"), name=fn.get("name"), arguments=fn.get("arguments"))
                    )
    if isinstance(obj.get("response"), str):
        reply.content = _append(reply.content, obj["response"])
        reply.reasoning_content = _append(reply.reasoning_content, obj.get("thinking"))
    if obj.get("done"):
        reply.complete = True
        reply.finish_reason = obj.get("done_reason") or "stop"
        if isinstance(obj.get("prompt_eval_count"), int):
            reply.prompt_tokens = obj["prompt_eval_count"]
        if isinstance(obj.get("eval_count"), int):
            reply.completion_tokens = obj["eval_count"]


_FEEDERS = {CHAT: _feed_openai, COMPLETION: _feed_openai, OLLAMA_CHAT: _feed_ollama, OLLAMA_GENERATE: _feed_ollama}
