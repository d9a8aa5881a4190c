"""Stack marks in ordinary responses, one row per stack's real body."""

from __future__ import annotations

import pytest

from toolproxy.stacks.markers import detect

ROWS = [
    ({"object": "chat.completion", "system_fingerprint": "fp_ollama", "choices": []}, "ollama", None),
    (
        {
            "model": "qwen3",
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "stop",
            "eval_count": 3,
        },
        "ollama",
        None,
    ),
    ({"error": "registry.ollama.ai/library/gemma3:latest does not support tools"}, "ollama", None),
    (
        {
            "error": {
                "message": "registry.ollama.ai/library/gemma3:latest does not support tools",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        },
        "ollama",
        None,
    ),
    ({"choices": [], "system_fingerprint": "b6512-a1b2c3d4"}, "llamacpp", "b6512-a1b2c3d4"),
    ({"choices": [], "timings": {"prompt_n": 3, "cache_n": 0}}, "llamacpp", None),
    (
        {"error": {"code": 500, "message": "tools param requires --jinja flag", "type": "server_error"}},
        "llamacpp",
        None,
    ),
    ({"error": {"code": 500, "message": "Failed to parse input at pos 3", "type": "server_error"}}, "llamacpp", None),
    ({"choices": [{"index": 0, "message": {}, "matched_stop": 151645}]}, "sglang", None),
    ({"choices": [], "metadata": {"weight_version": "default"}}, "sglang", None),
    ({"choices": [{"index": 0, "message": {}, "finish_reason": "stop", "stop_reason": None}]}, "vllm", None),
    ({"id": "x", "choices": [], "prompt_logprobs": None, "kv_transfer_params": None}, "vllm", None),
    (
        {
            "error": {
                "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        },
        "vllm",
        None,
    ),
    (
        {
            "object": "error",
            "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        "vllm",
        None,
    ),
    (
        {"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": None, "code": 404}},
        "vllm",
        None,
    ),
    ({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]}, "vllm", None),
    ({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "sglang"}]}, "sglang", None),
    ({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "llamacpp"}]}, "llamacpp", None),
]
UNKNOWN = [
    {"id": "chatcmpl-1", "object": "chat.completion", "system_fingerprint": "fp_44709d6fcb", "choices": []},
    {
        "error": {
            "message": "Invalid API key",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    },
    {"object": "error", "message": "bad request", "type": "BadRequestError", "param": None, "code": 400},
    {"object": "list", "data": [{"id": "m", "owned_by": "library"}]},
    None,
    [],
    "text",
]


@pytest.mark.parametrize("body,stack,version", ROWS)
def test_detect(body, stack, version):
    mark = detect(body)
    assert mark is not None and (mark.stack, mark.version) == (stack, version)


@pytest.mark.parametrize("body", UNKNOWN)
def test_no_mark(body):
    assert detect(body) is None
