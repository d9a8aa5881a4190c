"""Every serving stack toolproxy knows, described once, as data.

What a stack answers on the wire is what toolproxy measures, and four parts of the code need the
same facts: the fingerprint (which endpoints to ask, what answer marks the stack), the markers
(which fields and texts in an ordinary body name it), the advice (what its refusals mean) and the
emulators (which must send exactly those answers). Each fact is written here and read there, so a
stack that changes its wording is one edit, and a test can check that every emulator sends what
the detectors read (tests/test_stack_catalog.py). How each stack behaves, in words: docs/stacks.md.

Texts are the stacks' own, as read in their sources: llama.cpp tools/server (server-common.cpp,
utils.hpp), vLLM entrypoints/openai (serving_chat.py, protocol.py), SGLang srt/entrypoints/openai,
Ollama server/routes.go, server/images.go and openai/openai.go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Probe:
    """One read-only request the fingerprint makes, and the evidence it records when it marks a stack."""

    endpoint: str  # "METHOD /path"
    evidence: str


@dataclass(frozen=True, slots=True)
class Failure:
    """What a stack answers instead of running the model: status, message, and how to recognise it.

    `message` is a str.format template (`{model}`, `{pos}`, `{rest}`); `needle` is the lower-case
    part of it that identifies this failure in any body (the advice matches on it); `marks` are the
    parts that name the stack in an error body whatever its shape (the markers match on them).
    """

    status: int
    message: str
    needle: str
    marks: tuple[str, ...] = ()

    def text(self, **values: object) -> str:
        return self.message.format(**values)


# Failure kinds, the keys of Stack.failures.
TOOL_REFUSAL = "tools"  # a request with `tools` the stack, as launched, cannot serve
TOOL_CHOICE_REFUSAL = "tool_choice"  # a `tool_choice` without tools the stack, as launched, cannot serve
UNKNOWN_MODEL = "model"  # a model name the stack does not serve
PARSE_FAILURE = "parse"  # the model wrote call-shaped text the stack's parser failed on
INVALID_REQUEST = "request"  # a body the stack's request schema rejects


@dataclass(frozen=True, slots=True)
class Stack:
    """One serving stack: how toolproxy names it, finds it, and what it answers."""

    name: str  # as records and `--stack` spell it
    label: str  # as a person reads it
    port: int | None  # the port the real server listens on by default
    probes: tuple[Probe, ...] = ()  # GET requests the fingerprint makes, in order
    model_probe: Probe | None = None  # the POST the fingerprint adds once the stack is known and a model given
    banner: str | None = None  # the body of its GET / (Ollama's "Ollama is running")
    server_header: str | None = None  # its `Server` response header
    version: str | None = None  # the version (or build) its emulator reports
    system_fingerprint: str | None = None  # the constant `system_fingerprint` of its chat bodies
    owned_by: str = ""  # `owned_by` in its /v1/models list
    owner_marks: tuple[str, ...] = ()  # `owned_by` values (lower case) that name this stack
    failures: Mapping[str, Failure] = field(default_factory=dict)
    models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # its emulator's models -> capabilities
    chat_template: str | None = None  # the template its emulator reports for a tool-capable model


def _frozen(mapping: dict) -> Mapping:
    return MappingProxyType(mapping)


# A Qwen2.5/Hermes chat template as llama-server reports it in GET /props (Jinja).
HERMES_JINJA = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{{- \"# Tools\\n\\nYou may call one or more functions to assist "
    'with the user query.\\n\\n<tools>" }}{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
    "<tool_call></tool_call> XML tags\" }}{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + message.role "
    "+ '\\n' + (message.content or '') + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The same model's template as Ollama reports it in POST /api/show (Go text/template).
OLLAMA_TEMPLATE = (
    "{{- if .Messages }}{{- if or .System .Tools }}<|im_start|>system\n{{- if .System }}\n{{ .System }}{{- end }}"
    "{{- if .Tools }}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>"
    '{{- range .Tools }}\n{"type": "function", "function": {{ .Function }}}{{- end }}\n</tools>\n\nFor each '
    "function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags"
    "{{- end }}<|im_end|>\n{{ end }}{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n{{ else }}{{ .Prompt }}{{ end }}"
)

QWEN_HF = "Qwen/Qwen2.5-7B-Instruct"

OLLAMA = Stack(
    name="ollama",
    label="Ollama",
    port=11434,
    probes=(Probe("GET /", 'GET / says "Ollama is running"'), Probe("GET /api/version", "GET /api/version answers")),
    model_probe=Probe("POST /api/show", "POST /api/show answers"),
    banner="Ollama is running",
    version="0.12.6",
    system_fingerprint="fp_ollama",
    owned_by="library",
    failures=_frozen(
        {
            TOOL_REFUSAL: Failure(
                400, "{model} does not support tools", "does not support tools", ("does not support tools",)
            ),
            UNKNOWN_MODEL: Failure(
                404,
                'model "{model}" not found, try pulling it first',
                "try pulling it first",
                ("try pulling it first",),
            ),
            PARSE_FAILURE: Failure(500, "failed to parse JSON: unexpected end of JSON input", "failed to parse json"),
        }
    ),
    models=_frozen({"qwen2.5:7b": ("completion", "tools"), "gemma3:latest": ("completion", "vision")}),
    chat_template=OLLAMA_TEMPLATE,
)

LLAMACPP = Stack(
    name="llamacpp",
    label="llama.cpp (llama-server)",
    port=8080,
    probes=(Probe("GET /props", "GET /props has llama-server's fields"),),
    server_header="llama.cpp",
    version="b6500-3f4b1c2d",
    owned_by="llamacpp",
    owner_marks=("llamacpp", "llama.cpp"),
    failures=_frozen(
        {
            TOOL_REFUSAL: Failure(500, "tools param requires --jinja flag", "requires --jinja", ("--jinja",)),
            TOOL_CHOICE_REFUSAL: Failure(500, "Unsupported param: tool_choice", "unsupported param: tool_choice"),
            PARSE_FAILURE: Failure(500, "Failed to parse input at pos {pos}: {rest}", "failed to parse input"),
        }
    ),
    models=_frozen({"qwen2.5-7b-instruct-q4_k_m.gguf": ("completion", "tools")}),
    chat_template=HERMES_JINJA,
)

# llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`): the same llama.cpp
# engine as llama-server behind a FastAPI app of its own, with its own answers (llama_cpp/server/app.py,
# llama_cpp/llama_chat_format.py): a request that fails validation is HTTP 500 with the message in
# `error.message`; `tools` reach the prompt only when `tool_choice` names a function (otherwise
# they are dropped and the model answers in text); replies carry the requested model name and no
# `timings`; `GET /openapi.json` names the app.
LLAMACPP_PYTHON = Stack(
    name="llama-cpp-python",
    label="llama-cpp-python (llama_cpp.server)",
    port=8000,
    probes=(Probe("GET /openapi.json", 'GET /openapi.json is titled "\U0001f999 llama.cpp Python API"'),),
    server_header="uvicorn",
    version="0.3.36",
    owned_by="me",
    failures=_frozen(
        {
            INVALID_REQUEST: Failure(500, "1 validation error:\n  {rest}", "validation error"),
        }
    ),
    # /v1/models lists the model file as the launch named it, whatever name a request uses.
    models=_frozen({"models/qwen2.5-coder-0.5b.gguf": ("completion",)}),
)
OPENAPI_TITLE = "\U0001f999 llama.cpp Python API"

VLLM = Stack(
    name="vllm",
    label="vLLM",
    port=8000,
    probes=(Probe("GET /version", "GET /version answers {version}"),),
    server_header="uvicorn",
    version="0.11.0",
    owned_by="vllm",
    owner_marks=("vllm",),
    failures=_frozen(
        {
            TOOL_REFUSAL: Failure(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                "--enable-auto-tool-choice",
                ("--enable-auto-tool-choice", "--tool-call-parser"),
            ),
            UNKNOWN_MODEL: Failure(404, "The model `{model}` does not exist.", "does not exist"),
        }
    ),
    models=_frozen({QWEN_HF: ("completion", "tools")}),
)

SGLANG = Stack(
    name="sglang",
    label="SGLang",
    port=30000,
    probes=(
        Probe("GET /get_server_info", "GET /get_server_info answers with server args"),
        Probe("GET /server_info", "GET /server_info answers with server args"),
    ),
    server_header="uvicorn",
    version="0.5.4",
    owned_by="sglang",
    owner_marks=("sglang",),
    models=_frozen({QWEN_HF: ("completion", "tools")}),
)

LMSTUDIO = Stack(
    name="lmstudio",
    label="LM Studio",
    port=1234,
    probes=(
        Probe("GET /api/v1/models", "GET /api/v1/models lists LM Studio models"),
        Probe("GET /api/v0/models", "GET /api/v0/models lists LM Studio models"),
    ),
    owned_by="organization_owner",
    owner_marks=("lmstudio",),
    models=_frozen({"qwen2.5-7b-instruct": ("completion", "tools"), "google/gemma-3-4b": ("completion",)}),
)

OPENAI = Stack(
    name="openai",
    label="an OpenAI-compatible server",
    port=None,
    probes=(Probe("GET /v1/models", "GET /v1/models answers, no stack-specific markers"),),
    system_fingerprint="fp_" + "f33640a400",
    owned_by="system",
    failures=_frozen(
        {
            UNKNOWN_MODEL: Failure(
                404,
                "The model `{model}` does not exist or you do not have access to it.",
                "does not exist or you do not have access",
            ),
        }
    ),
    models=_frozen({"gpt-4o-mini": ("completion", "tools"), "gpt-4.1": ("completion", "tools")}),
)

# The one list of stacks, in the one order everything shows them (ollama first: the commonest).
CATALOG: tuple[Stack, ...] = (OLLAMA, LLAMACPP, VLLM, SGLANG, LMSTUDIO, LLAMACPP_PYTHON, OPENAI)
BY_NAME: Mapping[str, Stack] = _frozen({s.name: s for s in CATALOG})
STACKS: tuple[str, ...] = tuple(BY_NAME)

# What a fingerprint says when no stack answered as one (see fingerprint.detect_stack).
UNKNOWN = "unknown"
UNREACHABLE = "unreachable"
LABELS: Mapping[str, str] = _frozen(
    {**{s.name: s.label for s in CATALOG}, UNKNOWN: "an unidentified server", UNREACHABLE: "an unreachable server"}
)
