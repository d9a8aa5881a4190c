"""Pointing an unmodified harness at the proxy: the environment variables common clients read.

A harness can only be given a base URL, and every SDK looks for it under its own name. The
values carry the run's tag prefix (`/t/run=NAME/...`), so attribution needs no harness change.
The table says who reads what; `toolproxy run --print-env` shows the result.
"""

from __future__ import annotations

from collections.abc import Mapping

# (variable, suffix after the tagged base, who reads it)
BASE_URL_VARS: tuple[tuple[str, str, str], ...] = (
    (
        "OPENAI_BASE_URL",
        "/v1",
        "openai-python >= 1 (and openai-agents, pydantic-ai, smolagents' OpenAIServerModel through it)",
    ),
    ("OPENAI_API_BASE", "/v1", "langchain-openai, litellm's openai/ provider, older openai clients"),
    ("ANTHROPIC_BASE_URL", "", "anthropic SDK (it appends /v1/messages), Claude-Code-style clients"),
    ("OLLAMA_HOST", "", "the ollama Python and JavaScript clients"),
    ("OLLAMA_API_BASE", "", "litellm's ollama/ and ollama_chat/ providers"),
    ("OLLAMA_BASE_URL", "/v1", "pydantic-ai's ollama: models (Ollama's OpenAI-compatible endpoint)"),
    ("HOSTED_VLLM_API_BASE", "/v1", "litellm's hosted_vllm/ provider"),
    ("LM_STUDIO_API_BASE", "/v1", "litellm's lm_studio/ provider"),
    ("LLM_BASE_URL", "/v1", "OpenHands-style harnesses; inspect-ai's openai-api/llm/MODEL (with LLM_API_KEY)"),
)

# Set only when the harness's environment lacks them: the SDKs refuse to start without a key,
# and the proxy does not need one (use serve's --upstream-key-env for a real upstream key).
# inspect-ai's openai-api/SERVICE/MODEL reads SERVICE_BASE_URL and SERVICE_API_KEY and exits when
# either is missing: LLM_* is the service name that both OpenHands-style harnesses and it read.
PLACEHOLDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "LLM_API_KEY")
PLACEHOLDER = "toolproxy-no-key"

# Settings that keep common harnesses from reaching the internet or stopping for a person.
UNATTENDED = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm otherwise downloads its price list at import
    "OPENAI_AGENTS_DISABLE_TRACING": "1",  # openai-agents otherwise exports traces to OpenAI
    # mini-swe-agent otherwise starts its interactive first-run setup, then stops at the first
    # model litellm has no price for (every local one)
    "MSWEA_CONFIGURED": "true",
    "MSWEA_COST_TRACKING": "ignore_errors",
}


# For a script that tags its own requests (`$TOOLPROXY_BASE_URL/episode=3/item=q7/v1/...`): the
# proxy root with the run's tag prefix, always ending in one (bare `/t` when there are no tags),
# so appended `key=value` segments join the run's tags instead of replacing them.
TAGGABLE_BASE_VAR = "TOOLPROXY_BASE_URL"


def harness_env(base: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What to add to `environ` so a child process talks to `base` (a tagged proxy root)."""
    base = base.rstrip("/")
    env = {name: base + suffix for name, suffix, _ in BASE_URL_VARS}
    env[TAGGABLE_BASE_VAR] = base if "/t/" in base else base + "/t"
    env.update({k: v for k, v in UNATTENDED.items() if k not in environ})
    env.update({k: PLACEHOLDER for k in PLACEHOLDER_KEYS if not environ.get(k)})
    return env
