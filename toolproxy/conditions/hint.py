"""hint ("native+hint"): tools still sent, plus the fixed tool block in the system message.

The response is untouched: this arm measures whether spelling the tools out helps a model that
the stack already serves natively, so nothing about the answer may differ from native.
"""

from __future__ import annotations

import orjson

from toolproxy.conditions import ConditionOptions, Plan, RequestView, Skip
from toolproxy.conditions.messages import read_chat_request, upstream_path, with_system_text
from toolproxy.conditions.toolblock import render_block


class Hint:
    name = "hint"

    def prepare(self, request: RequestView, options: ConditionOptions) -> Plan | Skip:
        chat = read_chat_request(request)
        if isinstance(chat, Skip):
            return chat
        body = chat.upstream_body(with_system_text(chat.messages, render_block(chat.tools)), keep_tools=True)
        return Plan(path=upstream_path(request), body=orjson.dumps(body))


CONDITION = Hint()
