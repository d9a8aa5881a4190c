"""hint ("native+hint"): tools still sent, plus the fixed tool block in the system message.

The response is untouched: this arm measures whether spelling the tools out helps a model that
the stack already serves natively, so nothing about the answer may differ from native.
"""

from __future__ import annotations

import orjson

from toolproxy.conditions import ConditionOptions, Plan, Reject, RequestView, Skip
from toolproxy.conditions.bridge import Relay
from toolproxy.conditions.messages import ChatRequest, read_chat_request
from toolproxy.conditions.text import chat_reply
from toolproxy.conditions.toolblock import render_block


class Hint:
    name = "hint"

    def prepare(self, request: RequestView, options: ConditionOptions) -> Plan | Skip | Reject:
        chat = read_chat_request(request, bridge=options.bridge)
        if not isinstance(chat, ChatRequest):
            return chat
        body = chat.with_system_block(render_block(chat.tools))
        transform = chat_reply(chat, Relay()) if chat.bridged else None
        return Plan(path=chat.upstream_path(request), body=orjson.dumps(body), transform=transform)


CONDITION = Hint()
