"""One recorded exchange -> the rows the analyzer keeps about it. Pure: no database, no writes.

This is the per-record stage, and it runs in worker processes (and in the live view's
classifier), so it imports nothing it does not use: a worker that imported DuckDB and NumPy paid
~0.2 s of CPU each for nothing. Each record is analysed once, here (reassembly, classification,
conversation keys), so that re-deriving turns and episodes later reads small columns rather than
bodies. Reading segment lines into records, and setting aside the ones that cannot be stored, is
load/lines.py's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from toolproxy.analysis.classify import harnesses
from toolproxy.analysis.classify.attempt import classify
from toolproxy.analysis.classify.bodies import decode_body, header
from toolproxy.analysis.classify.firsttoken import first_token_ms
from toolproxy.analysis.classify.keys import UNTAGGED_RUN, Keys, Prefixes, call_signature, conversation_keys, thread_key
from toolproxy.analysis.classify.outcomes import CLIENT_GAVE_UP
from toolproxy.analysis.classify.protocols import read_prompt, reply_message
from toolproxy.analysis.classify.sides import (
    Side,
    carried_summary,
    opening_keys,
    returned_summary,
    side_request,
    text_key,
)
from toolproxy.record.model import MODEL_SENT, websocket_exchange
from toolproxy.record.pacing import EXTRA_KEY as PIECE_MS
from toolproxy.stacks.markers import detect
from toolproxy.wire import (
    GEMINI,
    OLLAMA_CHAT,
    OLLAMA_GENERATE,
    RESPONSES,
    Reply,
    Request,
    decode,
    family_of,
    read_request,
    stop_strings,
    tool_names,
)

_REWRITTEN_SURFACE = {"constrained": "constrained", "text": "text", "template": "text"}
_MARKER_BODY_LIMIT = 256 * 1024


def _json(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value, default=str).decode()


class ToolSet(NamedTuple):
    """A tool_sets row: content hash, canonical JSON, names."""

    hash: str
    tools: str
    names: list[str]


# Tool sets by the JSON of the array as sent; cleared past 4096 of them or _TOOL_SETS_LIMIT bytes of keys.
_TOOL_SETS: dict[bytes, ToolSet] = {}
_TOOL_SETS_LIMIT = 8 << 20
_tool_sets_held = 0


def tool_set(tools: list) -> ToolSet:
    """The tool_sets row of a tools array.

    The hash is over the key-sorted JSON, so the same tools spelled in another key order are one
    set. Harnesses resend the identical array every turn, so the result is cached by the array as
    sent (its JSON, a dict key hashed and compared in C: a digest of it cost more than the lookup),
    which is much cheaper than re-canonicalising it.
    """
    global _tool_sets_held
    sent = orjson.dumps(tools, default=str)
    hit = _TOOL_SETS.get(sent)
    if hit is None:
        canonical = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS, default=str)
        hit = ToolSet(hashlib.blake2b(canonical, digest_size=16).hexdigest(), canonical.decode(), tool_names(tools))
        if len(_TOOL_SETS) >= 4096 or _tool_sets_held > _TOOL_SETS_LIMIT:
            _TOOL_SETS.clear()
            _tool_sets_held = 0
        _TOOL_SETS[sent] = hit
        _tool_sets_held += len(sent)
    return hit


def harness_request(rec: dict, kind: str | None) -> tuple[dict | None, Request | None]:
    """The harness's request as sent (before any condition rewrite), and the same in chat terms:
    a Responses or Messages conversation becomes the message list a chat harness would send.
    `show` prints a request as read here, so it shows what the analyzer read."""
    text, encoding = rec.get("request_body"), rec.get("request_body_encoding")
    content_encoding = header(rec.get("request_headers"), "content-encoding")
    if type(text) is str and encoding != "base64" and not content_encoding:
        # UTF-8 text as recorded: orjson parses the str itself, without decode_body's encoded copy
        # (a str that is not valid UTF-8 fails to parse instead of to encode: no request either way)
        raw = text
    else:
        raw, _ = decode_body(text, encoding, content_encoding)
    if not raw:
        return None, None
    try:
        req = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(req, dict):
        return None, None
    return req, read_request(kind, req, _given(rec.get("path"), ""))


def _reply(rec: dict, kind: str | None, which: str) -> Reply:
    if which == "client":
        raw, problem = decode_body(rec.get("client_body"), rec.get("client_body_encoding"))
        reply = decode(raw, kind)
    elif websocket_exchange(rec):
        # the server's messages, one a line (record.model.WEBSOCKET); the headers are the upgrade's
        raw, problem = decode_body(rec.get("response_body"), rec.get("response_body_encoding"))
        reply = decode(raw, kind, "application/x-ndjson")
    else:
        headers = rec.get("response_headers")
        raw, problem = decode_body(
            rec.get("response_body"), rec.get("response_body_encoding"), header(headers, "content-encoding")
        )
        reply = decode(raw, kind, header(headers, "content-type"))
    if problem is not None:
        reply.unreadable = problem
    return reply


@dataclass(slots=True)
class Analyzed:
    """One exchange's rows: its exchanges row and calls rows (dicts keyed by column, as in
    tables.EXCHANGES and CALLS, without the columns set when turns are derived) and its tools."""

    exchange: dict[str, Any]
    calls: list[dict[str, Any]] = field(default_factory=list)
    tool_set: ToolSet | None = None


def _given(value: Any, default: Any) -> Any:
    """value, or default when the record left it out (null or ""). Not `value or default`: a
    wrongly typed false-ish value ({}, false, 0) must reach the column check, not be replaced."""
    return default if value is None or value == "" else value


def analyze_record(rec: dict, segment: str, offset: int, prefixes: Prefixes | None = None) -> Analyzed:
    """Everything the database keeps about one exchange record. Pure: no I/O. `prefixes`: the
    walks of the conversations of the records stored with it (keys.Prefixes).

    In order: what the harness asked, the replies recorded, the verdict on the reply the harness
    got, the model asked for, the conversation keys, and the row."""
    asked = _asked(rec)
    replies = _replies(rec, asked)
    verdict = _verdict(rec, asked, replies) if replies.view is not None else _Verdict()
    model = _model(rec, asked, replies) if asked.is_attempt else _NO_MODEL
    keys = _keys(rec, asked, verdict, model.model, prefixes) if asked.is_attempt else None
    return Analyzed(
        _exchange_row(rec, segment, offset, asked, replies, verdict, model, keys), verdict.calls, asked.tools_row
    )


@dataclass(slots=True)
class _Asked:
    """What the harness asked: the request's protocol family (None for no model request), its
    JSON and chat form, whether it is a side request, the tools it offered (in its `tools`, or in
    its prompt: `protocol`), and the harness's finishing tool among them."""

    path: str
    kind: str | None
    condition: str
    rewritten: bool
    req: dict | None
    request: Request | None
    side: Side | None  # what the harness asked for itself beside its task, if it is that (classify.sides)
    is_attempt: bool
    messages: list
    tools: list | None
    reading: Any
    protocol: str | None
    tools_row: ToolSet | None
    finisher: Any


def _asked(rec: dict) -> _Asked:
    path = _given(rec.get("path"), "")
    # A sampled-out exchange's stub (record/sampling.py) is counted, never analysed as a turn.
    kind = (
        family_of(path)
        if (rec.get("method", "POST") == "POST" or websocket_exchange(rec))
        and rec.get("kind", "exchange") == "exchange"
        else None
    )
    req, request = harness_request(rec, kind) if kind is not None else (None, None)
    messages = request.messages if request is not None else []
    tools = request.tools if request is not None and request.tools else None
    # What a harness asks for itself beside its task (a title, a summary, a probe...) is no turn of
    # it (classify.sides). An exchange on a WebSocket stands for the POST its message is (the
    # record's method is the upgrade's GET).
    side = side_request("POST" if websocket_exchange(rec) else rec.get("method"), path, req, messages, tools)
    # A request without tools may still offer some in its prompt (dspy, ReAct text loops, code
    # agents): it is then analysed as the chat conversation that prompt stands for.
    reading = read_prompt(messages) if tools is None and messages else None
    protocol = None
    if reading is not None:
        protocol, messages, tools = reading.protocol, reading.messages, reading.tools
    tools_row = tool_set(tools) if tools else None
    # The harness's own finishing tool, when the request offers one (classify.harnesses): its call,
    # not prose, is then the episode's answer.
    finisher = harnesses.finisher(protocol, tools, request.messages) if tools else None
    return _Asked(
        path,
        kind,
        _given(rec.get("condition"), "native"),
        rec.get("upstream_request") is not None,
        req,
        request,
        side,
        kind is not None and side is None,
        messages,
        tools,
        reading,
        protocol,
        tools_row,
        finisher,
    )


@dataclass(slots=True)
class _Replies:
    """The reply the harness got (`view`, with its status) and the stack's (`upstream`: the same
    object when the proxy passed it on unchanged), and the stack's marker in the latter."""

    view: Reply | None = None
    view_status: int | None = None
    upstream: Reply | None = None
    mark: Any = None


def _replies(rec: dict, asked: _Asked) -> _Replies:
    out = _Replies()
    if asked.is_attempt:
        if rec.get("client_body") is not None:
            out.view = _reply(rec, asked.kind, "client")
            out.view_status = rec.get("client_status") if rec.get("client_status") is not None else rec.get("status")
            if rec.get("response_body") is not None:
                # The template condition sends a chat request to a raw-completion endpoint: the
                # upstream's body is in that endpoint's protocol.
                up_path = (rec.get("upstream_request") or {}).get("path")
                out.upstream = _reply(rec, family_of(up_path) if up_path else asked.kind, "upstream")
        else:
            out.view = out.upstream = _reply(rec, asked.kind, "upstream")
            out.view_status = rec.get("status")
    elif rec.get("response_body") and (
        len(rec["response_body"]) <= _MARKER_BODY_LIMIT or (asked.side is not None and asked.side.carry is not None)
    ):
        out.upstream = _reply(rec, asked.kind, "upstream")
    if out.upstream is not None:
        out.mark = detect(out.upstream.first) or detect(out.upstream.last)
    return out


@dataclass(slots=True)
class _Verdict:
    """The reply's classification, its calls as calls rows, and what the conversation keys take
    from it (the reply as a later request would hold it, its call ids, its call signature)."""

    outcome: str | None = None
    sub_kind: str | None = None
    surface: str | None = None
    saw_prose: bool | None = None
    detail: str | None = None
    n_calls: int | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    chain_reply: Any = None
    reply_ids: list = field(default_factory=list)
    signature: str | None = None
    unread: bool = False  # a call's arguments did not parse: the reply's canonical form may not be the harness's
    finishes: bool | None = None
    spawns: list[str] | None = None  # "KEY CALL_ID" of each delivered call that starts a subagent (harnesses.spawned)


def _verdict(rec: dict, asked: _Asked, replies: _Replies) -> _Verdict:
    view, upstream = replies.view, replies.upstream
    tools_row = asked.tools_row
    c = classify(
        view,
        status=replies.view_status,
        error_kind=rec.get("error_kind"),
        tools=asked.tools,
        call_surface=_REWRITTEN_SURFACE.get(asked.condition, "native") if asked.rewritten else "native",
        tool_names=tools_row.names if tools_row else [],
        tool_set=tools_row.hash if tools_row else None,
        protocol=asked.protocol,
        stops=stop_strings(asked.req),
        stack_reply=upstream if upstream is not view else None,
    )
    detail = gave_up(rec) if c.sub_kind == CLIENT_GAVE_UP else c.detail
    out = _Verdict(c.outcome, c.sub_kind, c.surface, c.harness_saw_prose, detail, len(c.calls))
    exchange_id = rec.get("id")
    for call in c.calls:
        out.calls.append(
            {
                "exchange_id": exchange_id,
                "idx": call.idx,
                "name": call.name,
                "arguments_raw": call.arguments_raw,
                "arguments": _json(call.arguments),
                "surface": call.surface,
                "format": call.format,
                "offered": call.offered,
                "validated": call.validated,
                "valid": call.valid,
                "schema_errors": _json(call.schema_errors),
            }
        )
    if out.outcome != "non_response":
        if asked.protocol is None:
            out.chain_reply = (view.content, [(tc.name, tc.arguments) for tc in view.tool_calls])
            out.reply_ids = [tc.id for tc in view.tool_calls]
        else:
            out.chain_reply = reply_message(
                asked.protocol,
                view.content,
                [(call.name, call.arguments if call.arguments is not None else call.arguments_raw) for call in c.calls],
            )
    out.signature = call_signature([(call.name, call.arguments) for call in c.calls])
    out.unread = any(call.arguments is None and call.arguments_raw is not None for call in c.calls)
    # Named and offered, valid or not: a harness that stops there took it as the answer.
    out.finishes = out.outcome in ("valid_call", "invalid_args") and harnesses.finishes(
        asked.finisher,
        [(call.name, call.arguments) for call in c.calls],
        any(call.format != "tool_calls" for call in c.calls),
    )
    if out.outcome == "valid_call" and not out.saw_prose:
        out.spawns = harnesses.spawned(view.tool_calls, text_key)
    return out


def gave_up(rec: dict) -> str:
    """How long a client waited before it closed the connection with no token, in words."""
    waited = rec.get("duration_ms")
    said = (
        f"the client closed the connection after {waited / 1000:.1f} s"
        if isinstance(waited, (int, float))
        else "the client closed the connection"
    )
    if rec.get("ttfb_ms") is not None and rec.get("response_body"):
        said += ", with bytes but no token received (keep-alive comments)"
    else:
        said += ", before the stack answered"
    return said + ": its timeout, or its user stopped it"


class _Model(NamedTuple):
    """The model the stack was asked for (the harness's, unless a study sent another: modelswap),
    the harness's own, and whether it asked for a stream."""

    model: str | None
    harness_model: str | None
    stream_asked: Any


_NO_MODEL = _Model(None, None, None)


def _model(rec: dict, asked: _Asked, replies: _Replies) -> _Model:
    req = asked.req
    harness_model = req.get("model") if req is not None and isinstance(req.get("model"), str) else None
    if harness_model is None and asked.kind == GEMINI and asked.request is not None:
        harness_model = asked.request.model  # Gemini names it in the path
    sent = (rec.get("extra") or {}).get(MODEL_SENT) if isinstance(rec.get("extra"), dict) else None
    model = sent if isinstance(sent, str) and sent else harness_model
    if model is None and replies.upstream is not None:
        model = replies.upstream.model
    stream_asked = None
    if req is not None:
        stream_asked = req.get("stream")
        if stream_asked is None and asked.kind in (OLLAMA_CHAT, OLLAMA_GENERATE):
            stream_asked = True  # Ollama's native API streams unless told not to
        elif asked.kind == GEMINI and asked.request is not None:
            stream_asked = asked.request.stream  # Gemini asks in its path
    return _Model(model, harness_model, stream_asked)


def _keys(rec: dict, asked: _Asked, verdict: _Verdict, model: str | None, prefixes: Prefixes | None) -> Keys:
    """The request's conversation keys (classify.keys), which turns and episodes are chained by."""
    messages = asked.messages
    previous = asked.request.parameters.get("previous_response_id") if asked.request is not None else None
    if isinstance(previous, str):
        # A Responses request chained to a stored response carries only the new input: the
        # earlier conversation is the server's state, named by id, so it is part of this
        # request's state too (its link to the earlier turn is made after ingest).
        messages = [{"role": "previous_response", "content": previous}, *messages]
    tools_row = asked.tools_row
    keys = conversation_keys(
        messages,
        tool_set=tools_row.hash if tools_row else None,
        tool_names=tools_row.names if tools_row else [],
        model=model,
        reply=verdict.chain_reply,
        reply_ids=verdict.reply_ids,
        asks_again=asked.reading is not None and asked.reading.fallback,
        reply_unread=verdict.unread,
        prefixes=prefixes,
        scope=(run if isinstance(run := rec.get("run"), str) else None, rec.get("episode") is None),
    )
    if isinstance(previous, str):
        # linked to the stored response after ingest (load.pipeline.link_stored_responses), which
        # may be another thread's: its run is grouped whole
        keys = keys._replace(thread=None)
    return keys


def _record_meta(rec: dict, asked: _Asked, replies: _Replies, verdict: _Verdict, model: _Model) -> dict[str, Any]:
    """The exchanges row's `record` column: what else the record and its reading said."""
    view, request = replies.view, asked.request
    meta = {
        "v": rec.get("v"),
        "client_path": rec.get("client_path"),
        "request_body_size": rec.get("request_body_size"),
        "response_complete": rec.get("response_complete"),
        "stream_requested": model.stream_asked,
        "reply_complete": view.complete if view is not None else None,
        "classification_detail": verdict.detail if verdict.outcome == "non_response" else None,
        "extra": rec.get("extra") or None,
    }
    if model.harness_model is not None and model.harness_model != model.model:
        meta["harness_model"] = model.harness_model
    if asked.kind == RESPONSES:
        meta["response_id"] = view.id if view is not None else None
        meta["previous_response_id"] = request.parameters.get("previous_response_id") if request is not None else None
    return meta


def _exchange_row(
    rec: dict,
    segment: str,
    offset: int,
    asked: _Asked,
    replies: _Replies,
    verdict: _Verdict,
    model: _Model,
    keys: Keys | None,
) -> dict[str, Any]:
    """The exchanges row, keyed by column (tables.EXCHANGES, without turn_id and analyzer_version)."""
    view, upstream, mark = replies.view, replies.upstream, replies.mark
    usage = upstream if upstream is not None else view
    meta = _record_meta(rec, asked, replies, verdict, model)
    return {
        "id": rec.get("id"),
        "kind": rec.get("kind", "exchange"),
        "started_at": rec.get("started_at"),
        "ended_at": rec.get("ended_at"),
        "ttfb_ms": rec.get("ttfb_ms"),
        "duration_ms": rec.get("duration_ms"),
        "run": _given(rec.get("run"), UNTAGGED_RUN),
        "episode": rec.get("episode"),
        "item": rec.get("item"),
        "condition": asked.condition,
        "tags": _json(rec.get("tags") or {}),
        "upstream": rec.get("upstream"),
        "method": rec.get("method"),
        "path": asked.path,
        "query": rec.get("query"),
        "status": rec.get("status"),
        "client_status": rec.get("client_status"),
        "error_kind": rec.get("error_kind"),
        "error_message": rec.get("error_message"),
        "is_attempt": asked.is_attempt,
        "streamed": view.streamed if view is not None else None,
        "model": model.model,
        "prompt_tokens": usage.prompt_tokens if usage is not None else None,
        "completion_tokens": usage.completion_tokens if usage is not None else None,
        "cached_tokens": usage.cached_tokens if usage is not None else None,
        "tool_set": asked.tools_row.hash if asked.tools_row else None,
        "upstream_request": _json(rec.get("upstream_request")),
        "condition_note": rec.get("condition_note"),
        "request_headers": _json(rec.get("request_headers")),
        "response_headers": _json(rec.get("response_headers")),
        "segment": segment,
        "segment_offset": offset,
        "record": _json(meta),
        "outcome": verdict.outcome,
        "sub_kind": verdict.sub_kind,
        "surface": verdict.surface,
        "n_calls": verdict.n_calls,
        "finish_reason": view.finish_reason if view is not None else None,
        "content": view.content if view is not None else None,
        "reasoning_content": view.reasoning_content if view is not None else None,
        "upstream_content": upstream.content if (asked.rewritten and upstream is not None) else None,
        "harness_saw_prose": verdict.saw_prose,
        "stack_marker": mark.stack if mark else None,
        "stack_marker_version": mark.version if mark else None,
        "n_messages": keys.n_messages if keys else None,
        "state_hash": keys.state_hash if keys else None,
        "chain_hash": keys.chain_hash if keys else None,
        "parent_hashes": keys.parent_hashes if keys else None,
        "item_hash": keys.item_hash if keys else None,
        "call_signature": verdict.signature,
        "tool_results": keys.tool_results if keys else None,
        "protocol": asked.protocol,
        "reply_keys": keys.reply_keys if keys else None,
        "rejects": keys.rejects if keys else None,
        "finishes": verdict.finishes,
        "prior_hash": keys.prior_hash if keys else None,
        "prefix_links": keys.prefix_links if keys else None,
        "thread": keys.thread
        if keys
        else (thread_key(asked.messages) if asked.side is not None and asked.side.carry else None),
        "finisher": asked.finisher.harness if asked.finisher is not None else None,
        **_links(rec, asked, replies, verdict),
    }


def _links(rec: dict, asked: _Asked, replies: _Replies, verdict: _Verdict) -> dict[str, Any]:
    """The side request's kind, the first token's time, and the text keys that link the
    conversations of one task prefix chaining cannot follow (episodes.links): a subagent's opens
    with its call's task, a compacted task's with the summary it goes on from."""
    side = asked.side
    summary = continues = opening = None
    if side is not None and side.carry is not None:
        summary = returned_summary(side, replies.upstream.content if replies.upstream is not None else None)
    if asked.is_attempt and asked.messages:
        continues = carried_summary(asked.messages)
        opening = opening_keys(asked.req)
    return {
        "side_request": side.kind if side is not None else None,
        "ttft_ms": _first_token(rec, replies.view),
        "summary": summary,
        "continues": continues,
        "opening": opening,
        "spawns": verdict.spawns,
    }


def _first_token(rec: dict, view: Reply | None) -> float | None:
    """When the reply's first token came (classify.firsttoken), from the body as it came upstream
    and when each of its pieces arrived."""
    if rec.get("response_body_encoding") not in (None, "utf8") or header(
        rec.get("response_headers"), "content-encoding"
    ):
        return None
    extra = rec.get("extra")
    marks = extra.get(PIECE_MS) if isinstance(extra, dict) else None
    streamed = (
        view.streamed
        if view is not None
        else (header(rec.get("response_headers"), "content-type") or "").startswith("text/event-stream")
    )
    return first_token_ms(rec.get("response_body"), rec.get("ttfb_ms"), marks, streamed)


def fingerprint_row(rec: dict, segment: str, offset: int) -> dict[str, Any]:
    """A fingerprint record (the stack as it described itself at start), kept whole as JSON.

    The fingerprint itself travels in the record's `extra` (toolproxy.stacks.fingerprint); a stack
    it could not identify ("unknown", "unreachable") leaves the column empty so the run falls back
    to the markers in its responses.
    """
    extra = rec.get("extra")
    fp = extra if isinstance(extra, dict) and "stack" in extra else rec
    stack = fp.get("stack")
    version = fp.get("stack_version") or fp.get("version")
    if isinstance(stack, dict):
        version = version or stack.get("version")
        stack = stack.get("name") or stack.get("stack")
    if stack in ("unknown", "unreachable"):
        stack = version = None
    return {
        "id": rec.get("id"),
        "run": rec.get("run"),
        "upstream": rec.get("upstream"),
        "recorded_at": rec.get("started_at"),
        "stack": stack if isinstance(stack, str) else None,
        "stack_version": version if isinstance(version, str) else None,
        "model": fp.get("model") if isinstance(fp.get("model"), str) else None,
        "record": _json(rec),
        "segment": segment,
        "segment_offset": offset,
    }
