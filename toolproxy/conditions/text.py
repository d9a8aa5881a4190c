"""text ("text-tools"): no `tools` on the wire; the model reads the tool block and writes calls as text.

The stack never sees a tool, so it can neither refuse the request nor fail to parse the call:
toolproxy parses the reply itself (`toolproxy.calls.parse_text`, the analyzer's own parsers) and
answers with standard `tool_calls`, streaming prose live and holding text back only from the
first possible call marker on.
"""

from __future__ import annotations

from functools import partial

import orjson

from toolproxy.conditions import ConditionOptions, Plan, RequestView, Skip
from toolproxy.conditions.messages import (
    OPENAI,
    ChatRequest,
    history_as_text,
    read_chat_request,
    upstream_path,
    with_system_text,
)
from toolproxy.conditions.synth import emitter_for
from toolproxy.conditions.toolblock import format_call, format_result, render_block, tool_functions
from toolproxy.conditions.transform import (
    CallScanner,
    Interpreter,
    ReplyTransform,
    markers_for,
    text_calls,
    tool_names_of,
)
from toolproxy.conditions.upstream import UpstreamReader

# Fields that would make the stack render or parse tools itself.
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")


def without_tools(chat: ChatRequest, messages: list) -> dict:
    """The request body with the tool fields removed, the given messages, and usage asked for when streaming."""
    body = {k: v for k, v in chat.body.items() if k not in TOOL_FIELDS}
    body["messages"] = messages
    if chat.api == OPENAI and chat.stream:
        # Usage is wanted in the record even when the harness did not ask; the harness still only
        # gets a usage chunk if it asked for one.
        options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
        body["stream_options"] = {**options, "include_usage": True}
    return body


def chat_reply(chat: ChatRequest, interpreter: Interpreter) -> ReplyTransform:
    """The transform for a chat request sent on as chat: read the same API's reply, answer in it."""
    reader = UpstreamReader("openai_chat" if chat.api == OPENAI else "ollama_chat", chat.stream)
    return ReplyTransform(reader, interpreter, emitter_for(chat.api, chat.body, chat.stream))


class Text:
    name = "text"

    def prepare(self, request: RequestView, options: ConditionOptions) -> Plan | Skip:
        chat = read_chat_request(request)
        if isinstance(chat, Skip):
            return chat
        messages = history_as_text(chat.messages, format_call, format_result)
        body = without_tools(chat, with_system_text(messages, render_block(chat.tools)))
        names = tool_names_of(tool_functions(chat.tools))
        scanner = CallScanner(partial(text_calls, tool_names=names, formats=None), markers_for(None))
        return Plan(path=upstream_path(request), body=orjson.dumps(body), transform=chat_reply(chat, scanner))


CONDITION = Text()
