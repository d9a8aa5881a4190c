"""text ("text-tools"): no `tools` on the wire; the model reads the tool block and writes calls as text.

The stack never sees a tool, so it can neither refuse the request nor fail to parse the call:
toolproxy parses the reply itself (`toolproxy.calls.parse_text`, the analyzer's own parsers) and
answers with native calls in the client's protocol (`tool_calls`, Responses `function_call` items,
Messages `tool_use` blocks), streaming prose live and holding text back only from the first
possible call marker on.
"""

from __future__ import annotations

from functools import partial

import orjson

from toolproxy import wire
from toolproxy.calls import start_markers
from toolproxy.conditions import ConditionOptions, Plan, Reject, RequestView, Skip
from toolproxy.conditions.messages import ChatRequest, history_as_text, read_chat_request, with_system_text
from toolproxy.conditions.toolblock import format_call, format_result, render_block
from toolproxy.conditions.transform import CallScanner, Interpreter, ReplyTransform, text_calls


def without_tools(chat: ChatRequest, messages: list, drop: tuple[str, ...] = ()) -> dict:
    """The request body with the tool fields removed, the given messages, and usage asked for when streaming."""
    body = chat.upstream_body(messages, keep_tools=False, drop=drop)
    if chat.sent_family == wire.CHAT and chat.stream:
        # Usage is wanted in the record even when the harness did not ask; the harness still only
        # gets a usage chunk if it asked for one.
        options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
        body["stream_options"] = {**options, "include_usage": True}
    return body


def chat_reply(chat: ChatRequest, interpreter: Interpreter) -> ReplyTransform:
    """The transform for a conversation request: read the reply in the protocol it was sent in,
    answer in the client's."""
    encoder = wire.encoder_for(chat.family, chat.body, chat.stream, chat.query, chat.request.model)
    return ReplyTransform(wire.Decoder(chat.sent_family), interpreter, encoder)


class TextCondition:
    name = "text"

    def prepare(self, request: RequestView, options: ConditionOptions) -> Plan | Skip | Reject:
        chat = read_chat_request(request, bridge=options.bridge)
        if not isinstance(chat, ChatRequest):
            return chat
        messages = history_as_text(chat.messages, format_call, format_result)
        body = without_tools(chat, with_system_text(messages, render_block(chat.tools)))
        names = tuple(wire.tool_names(chat.tools))
        scanner = CallScanner(partial(text_calls, tool_names=names, formats=None), start_markers())
        return Plan(path=chat.upstream_path(request), body=orjson.dumps(body), transform=chat_reply(chat, scanner))


CONDITION = TextCondition()
