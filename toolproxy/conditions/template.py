"""template ("maker's layout"): toolproxy renders the conversation with a chat template the user
supplies and sends the prompt to the stack's raw completion endpoint.

This takes the stack's own template handling out of the measurement (Ollama's template drift,
a GGUF shipping an old template, a tool parser that does not match): the model gets the layout
its maker documented, and the reply is parsed with the parser the user names.

| stack                                   | endpoint               | prompt field | length field  |
|-----------------------------------------|------------------------|--------------|---------------|
| llamacpp                                | `/completion`          | prompt       | n_predict     |
| ollama                                  | `/api/generate`, raw   | prompt       | options.num_predict |
| vllm, sglang, openai, lmstudio, unknown | `/v1/completions`      | prompt       | max_tokens    |
"""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson

from toolproxy import wire
from toolproxy.calls import start_markers
from toolproxy.conditions import ConditionOptions, Plan, Reject, RequestView, Skip
from toolproxy.conditions.chat_template import TemplateError, cached_template
from toolproxy.conditions.messages import ChatRequest, read_chat_request, upstream_path
from toolproxy.conditions.transform import CallScanner, ReplyTransform, text_calls

# Sampling fields that mean the same on every completion endpoint.
_SAMPLING = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty")


def _max_tokens(body: dict[str, Any]) -> Any:
    return body.get("max_completion_tokens", body.get("max_tokens"))


def completion_request(
    stack: str | None, chat_path: str, body: dict[str, Any], prompt: str, stream: bool
) -> tuple[str, dict[str, Any], str]:
    """(path, body, wire family) of the raw completion request for a stack (table above)."""
    sampling = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
    if isinstance(sampling.get("stop"), str) and stack in ("llamacpp", "ollama"):
        sampling["stop"] = [sampling["stop"]]  # OpenAI allows one string; these take only lists
    limit = _max_tokens(body)
    if stack == "llamacpp":
        out = {"prompt": prompt, "stream": stream, **sampling}
        if limit is not None:
            out["n_predict"] = limit
        return "/completion", out, wire.COMPLETION
    if stack == "ollama":
        options = {k: v for k, v in sampling.items() if k in ("temperature", "top_p", "seed", "stop")}
        if limit is not None:
            options["num_predict"] = limit
        out = {"model": body.get("model"), "prompt": prompt, "raw": True, "stream": stream}
        if options:
            out["options"] = options
        return "/api/generate", out, wire.OLLAMA_GENERATE
    out = {"model": body.get("model"), "prompt": prompt, "stream": stream, **sampling}
    if limit is not None:
        out["max_tokens"] = limit
    if stream:
        out["stream_options"] = {"include_usage": True}
    if stack == "vllm":
        out["add_special_tokens"] = False  # the template already wrote BOS where the model wants it
    base = chat_path[: -len("/chat/completions")] if chat_path.endswith("/chat/completions") else "/v1"
    return base + "/completions", out, wire.COMPLETION


class Template:
    name = "template"

    def prepare(self, request: RequestView, options: ConditionOptions) -> Plan | Skip | Reject:
        if not options.chat_template:
            return Skip("no chat template: start toolproxy serve with --chat-template FILE")
        chat = read_chat_request(request, need_tools=False, families=(wire.CHAT,))
        if not isinstance(chat, ChatRequest):
            return chat
        try:
            template = cached_template(options.chat_template)
            extra = chat.body.get("chat_template_kwargs")
            prompt = template.render(chat.messages, chat.tools or None, extra if isinstance(extra, dict) else None)
        except TemplateError as exc:
            return Reject(400, str(exc))
        path, body, family = completion_request(options.stack, request.path, chat.body, prompt, chat.stream)
        names = tuple(wire.tool_names(chat.tools)) or None
        formats = (options.parser,) if options.parser else None
        scanner = CallScanner(partial(text_calls, tool_names=names, formats=formats), start_markers(formats))
        encoder = wire.encoder_for(chat.family, chat.body, chat.stream)
        transform = ReplyTransform(wire.Decoder(family), scanner, encoder)
        return Plan(path=upstream_path(request, path), body=orjson.dumps(body), transform=transform)


CONDITION = Template()
