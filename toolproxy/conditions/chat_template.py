"""A model maker's Jinja chat template, rendered the way Hugging Face transformers renders it.

The template condition exists to show what a model does when it gets exactly the layout it was
trained on, so the rendering must match `tokenizer.apply_chat_template(..., tokenize=False,
add_generation_prompt=True)`: the same sandboxed environment settings (trim_blocks, lstrip_blocks,
loop controls, the `{% generation %}` tag), the same `tojson` (no key sorting, no HTML escaping,
unlike Jinja's built-in one), `raise_exception`, `strftime_now`, and the special tokens from
tokenizer_config.json.

Tool-call arguments arrive from OpenAI clients as JSON strings, but templates were written for
objects (Qwen2.5 applies `tojson` to them): they are decoded first, as vLLM and llama.cpp do.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from toolproxy.conditions.toolblock import arguments_value
from toolproxy.wire import text_of


class TemplateError(ValueError):
    """A template that cannot be loaded or rendered; the message names the file and the cause."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant spans for training masks; rendering keeps the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


def _token(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@dataclass(frozen=True)
class ChatTemplate:
    path: str
    sources: dict[str, str]  # template name ("default", "tool_use", ...) -> Jinja source
    special_tokens: dict[str, str]

    def source_for(self, has_tools: bool) -> tuple[str, str]:
        if has_tools and "tool_use" in self.sources:
            return "tool_use", self.sources["tool_use"]
        if "default" in self.sources:
            return "default", self.sources["default"]
        name = next(iter(self.sources))
        return name, self.sources[name]

    def render(self, messages: list[Any], tools: list[Any] | None, extra: dict[str, Any] | None = None) -> str:
        name, source = self.source_for(bool(tools))
        try:
            template = _ENV.from_string(source)
            return template.render(
                messages=prepare_messages(messages),
                tools=tools or None,
                add_generation_prompt=True,
                **self.special_tokens,
                **(extra or {}),
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(
                f"chat template {self.path} ({name}) failed to render: {type(exc).__name__}: {exc}"
            ) from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise TemplateError(
                f"chat template {self.path} ({name}) failed to render: {type(exc).__name__}: {exc}"
            ) from None


def prepare_messages(messages: list[Any]) -> list[Any]:
    """Messages as templates expect them: text parts joined, tool-call arguments as objects."""
    out = []
    for msg in messages:
        if not isinstance(msg, dict):
            out.append(msg)
            continue
        msg = dict(msg)
        if isinstance(msg.get("content"), list):
            msg["content"] = text_of(msg["content"])
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = [_decoded_call(c) for c in msg["tool_calls"]]
        out.append(msg)
    return out


def _decoded_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = dict(call["function"])
    if "arguments" in fn:
        fn["arguments"] = arguments_value(fn["arguments"])
    return {**call, "function": fn}


def load_template(path: str | os.PathLike) -> ChatTemplate:
    """A .jinja file, or a tokenizer_config.json whose `chat_template` is a string or a list of named templates."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TemplateError(f"chat template {p}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TemplateError(f"chat template {p}: not UTF-8 text") from None
    tokens: dict[str, str] = {}
    if p.suffix == ".json":
        try:
            config = json.loads(text)
        except ValueError as exc:
            raise TemplateError(f"chat template {p}: not valid JSON ({exc})") from None
        raw = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(raw, str):
            sources = {"default": raw}
        elif isinstance(raw, list) and all(isinstance(t, dict) and "name" in t and "template" in t for t in raw):
            sources = {t["name"]: t["template"] for t in raw}
        else:
            raise TemplateError(f"chat template {p}: no 'chat_template' string or list of named templates in it")
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = _token(config.get(key))
            if value is not None:
                tokens[key] = value
    else:
        sources = {"default": text}
    for name, source in sources.items():
        try:
            _ENV.parse(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template {p} ({name}): syntax error at line {exc.lineno}: {exc.message}"
            ) from None
    return ChatTemplate(str(p), sources, tokens)


_cache: dict[str, ChatTemplate] = {}


def cached_template(path: str) -> ChatTemplate:
    """Loaded once per proxy process (`serve` loads it at start), so requests never touch the disk."""
    if path not in _cache:
        _cache[path] = load_template(path)
    return _cache[path]
