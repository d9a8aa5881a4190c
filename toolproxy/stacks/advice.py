"""What each stack's refusals mean and what to change, as data: the knowledge `doctor` prints.

The texts that identify a refusal are the stacks' own, in their catalog entries
(`toolproxy.stacks.catalog`; how each stack refuses: docs/stacks.md#refusals). A new refusal
pattern is one more failure there and one more row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolproxy.stacks.catalog import (
    LABELS,
    LLAMACPP,
    LLAMACPP_PYTHON,
    LMSTUDIO,
    OLLAMA,
    PARSE_FAILURE,
    SGLANG,
    TOOL_REFUSAL,
    VLLM,
)

TOOLPROXY_WORKAROUND = (
    "or keep the stack as it is and serve through toolproxy with `--condition text` "
    "(tools described in the prompt, calls parsed by toolproxy)"
)


@dataclass(frozen=True, slots=True)
class KnownRefusal:
    stack: str | None  # None: any stack
    needle: str  # lower-case substring of the error text
    meaning: str  # a sentence, capitalised: printed after the stack's own words
    fix: str


REFUSALS = (
    KnownRefusal(
        OLLAMA.name,
        OLLAMA.failures[TOOL_REFUSAL].needle,
        "Ollama refuses `tools` for a model whose capabilities lack 'tools' (its template has no tool "
        "section); the model never ran",
        "pick a model (or tag) whose template supports tools: `ollama show MODEL` must list 'tools' "
        "under Capabilities; " + TOOLPROXY_WORKAROUND,
    ),
    KnownRefusal(
        None,
        VLLM.failures[TOOL_REFUSAL].needle,
        "vLLM refuses tool requests with tool_choice 'auto' unless it was launched with a tool parser; "
        "the model never ran",
        "relaunch vLLM with `--enable-auto-tool-choice --tool-call-parser NAME` (hermes for Qwen2.5 and "
        "Hermes-style models, llama3_json for Llama 3.x, mistral, pythonic, qwen3_coder...); " + TOOLPROXY_WORKAROUND,
    ),
    KnownRefusal(
        None,
        LLAMACPP.failures[TOOL_REFUSAL].needle,
        "This llama-server was started with --no-jinja, so it cannot render tools into the prompt; the model never ran",
        "restart llama-server with `--jinja` (the default in recent builds: drop `--no-jinja`); "
        + TOOLPROXY_WORKAROUND,
    ),
    KnownRefusal(
        LLAMACPP.name,
        LLAMACPP.failures[PARSE_FAILURE].needle,
        "The model ran, but its output did not match the tool-call format llama-server detected "
        "from the chat template, and llama-server answered 500 instead of returning the text",
        "start llama-server with `--jinja --chat-template-file` pointing at the model maker's template "
        "(so the detected format is the one the model writes); " + TOOLPROXY_WORKAROUND,
    ),
    KnownRefusal(
        OLLAMA.name,
        OLLAMA.failures[PARSE_FAILURE].needle,
        "Ollama's model-specific tool parser failed on the model's output and answered 500",
        "try a newer Ollama or another tag of the model; " + TOOLPROXY_WORKAROUND,
    ),
    KnownRefusal(
        None,
        "does not support tool",
        "The server refuses tools for this model",
        "use a model the server marks as tool-capable; " + TOOLPROXY_WORKAROUND,
    ),
)

# parse_text format -> (vLLM --tool-call-parser, SGLang --tool-call-parser)
PARSERS = {
    "hermes": ("hermes", "qwen25"),
    "qwen_xml": ("qwen3_coder", "qwen3_coder"),
    "llama_json": ("llama3_json", "llama3"),
    "python_tag": ("llama3_json", "llama3"),
    "mistral": ("mistral", "mistral"),
    "pythonic": ("pythonic", "pythonic"),
}

PLAIN_JSON = ("fenced_json", "bare_json")

FORMAT_LABELS = {
    "hermes": "Hermes/Qwen `<tool_call>{...}</tool_call>`",
    "qwen_xml": "Qwen3-Coder XML `<tool_call><function=...>`",
    "llama_json": 'Llama 3 JSON `{"name": ..., "parameters": ...}`',
    "python_tag": "Llama 3 `<|python_tag|>` JSON",
    "mistral": "Mistral `[TOOL_CALLS]`",
    "pythonic": "pythonic `[f(a=1)]`",
    "functiongemma": "FunctionGemma `<start_function_call>`",
    "lmstudio": "LM Studio `[TOOL_REQUEST]`",
    "fenced_json": "a fenced ```json block",
    "bare_json": "a bare JSON object",
}


def explain_refusal(stack: str, error_text: str) -> KnownRefusal | None:
    """The known refusal this error text is, preferring the rows for this stack."""
    text = error_text.lower()
    rows = sorted(REFUSALS, key=lambda r: r.stack != stack)
    return next((r for r in rows if (r.stack in (None, stack)) and r.needle in text), None)


def text_surface_fix(stack: str, fmt: str | None) -> str:
    """What to change when the stack accepted tools but left the call in `content`."""
    vllm_parser, sglang_parser = PARSERS.get(fmt or "", (None, None))
    if stack == VLLM.name:
        if vllm_parser:
            return (
                f"relaunch vLLM with `--enable-auto-tool-choice --tool-call-parser {vllm_parser}` (the parser that "
                "reads this format); " + TOOLPROXY_WORKAROUND
            )
        return "no vLLM tool parser reads this format: " + TOOLPROXY_WORKAROUND.removeprefix("or ")
    if stack == SGLANG.name:
        if sglang_parser:
            renamed = " (called `qwen` in newer SGLang releases)" if sglang_parser == "qwen25" else ""
            return f"relaunch SGLang with `--tool-call-parser {sglang_parser}`{renamed}; " + TOOLPROXY_WORKAROUND
        return "no SGLang tool parser reads this format: " + TOOLPROXY_WORKAROUND.removeprefix("or ")
    if stack in (LLAMACPP.name, OLLAMA.name) and fmt in PLAIN_JSON:
        server = "llama-server" if stack == LLAMACPP.name else OLLAMA.label
        return (
            f"no {server} parser reads plain JSON calls: it parses only the tool format its chat template "
            "declares. Serve through toolproxy with `--condition text` (reads plain JSON calls) or "
            "`--condition constrained`, or give it a chat template whose tool format this model writes"
        )
    if stack == LLAMACPP.name:
        return (
            "llama-server picks its parser from the chat template, and this model wrote a different format: "
            "run it with `--jinja --chat-template-file` set to a template of the format the model writes; "
            + TOOLPROXY_WORKAROUND
        )
    if stack == OLLAMA.name:
        return (
            "Ollama parses calls with the format its model template declares, and this model wrote another: "
            "use a model tag whose template matches (or set TEMPLATE in a Modelfile); " + TOOLPROXY_WORKAROUND
        )
    if stack == LLAMACPP_PYTHON.name:
        return (
            "llama-cpp-python's default chat handler drops `tools` unless `tool_choice` names a function (then "
            "it forces that call): launch it with `--chat_format chatml-function-calling` to let the model "
            "choose, or have the harness name the tool; " + TOOLPROXY_WORKAROUND
        )
    if stack == LMSTUDIO.name:
        return (
            "LM Studio parses calls natively only for a model it marks as trained for tool use, and otherwise "
            "only `[TOOL_REQUEST]` blocks: load such a model, or one that writes `[TOOL_REQUEST]`; "
            + TOOLPROXY_WORKAROUND
        )
    return f"{LABELS.get(stack, stack)} did not extract the call: " + TOOLPROXY_WORKAROUND.removeprefix("or ")


MODEL_FIX = (
    "the serving layer did its part; the model itself did not call. Try `--condition hint` (tools "
    "described in the prompt too) or `--condition constrained` (decoding forced to a valid call or a "
    "final answer), or a model trained for tool use"
)
