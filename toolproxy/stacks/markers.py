"""Which serving stack wrote a response, from marks it leaves in every body.

Fingerprinting asks a stack directly at start; this is the fallback for recordings made without
one (and a cross-check for them): each stack leaves its own fields in ordinary responses. Pure
function over one parsed JSON object so the proxy's fingerprinting and the analyzer share it. The
texts and constants it looks for are the stacks' catalog entries (`toolproxy.stacks.catalog`); the
field shapes are listed here (how each stack behaves: docs/stacks.md).

Marks (docs/stacks.md#how-toolproxy-tells-them-apart, checked against the stacks' sources):
- Ollama: its constant `system_fingerprint` on /v1; native bodies carry `done` + `eval_count` /
  `total_duration`; its failure texts (a tools refusal, a model to pull).
- llama.cpp: `timings` (prompt_n, predicted_n, cache_n...); `system_fingerprint` is the build
  string `b<build>-<commit>`; errors are `{"error": {"code": <int>, "type": "server_error"...}}`.
- SGLang: `choices[].matched_stop`, `metadata.weight_version`.
- vLLM: `choices[].stop_reason`, top-level `prompt_logprobs` / `kv_transfer_params`; errors with an
  integer `code` and a Python exception name as `type` ("BadRequestError"), or its launch flags in
  the message.
- `/v1/models` lists: `owned_by` names vLLM, SGLang and llama.cpp (catalog `owner_marks`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from toolproxy.stacks.catalog import CATALOG, LLAMACPP, OLLAMA, SGLANG, TOOL_REFUSAL, VLLM

_LLAMACPP_BUILD = re.compile(r"^b(\d+)(?:-([0-9a-f]+))?$")
_OWNED_BY = {mark: stack.name for stack in CATALOG for mark in stack.owner_marks}
# A flat string error is Ollama's native format: any of its failure texts names it.
_OLLAMA_TEXTS = tuple(mark for f in OLLAMA.failures.values() for mark in f.marks)
# In a nested or flat-object error only a tools refusal's texts are read (launch flags, the
# refusal sentence), in this order; the evidence each gives.
_REFUSAL_TEXTS = tuple(
    (stack.name, stack.failures[TOOL_REFUSAL].marks, evidence)
    for stack, evidence in (
        (VLLM, "error names vLLM launch flags"),
        (LLAMACPP, "error names --jinja"),
        (OLLAMA, "error text"),
    )
)


@dataclass(frozen=True, slots=True)
class StackMark:
    stack: str
    version: str | None
    evidence: str


_OLLAMA_FINGERPRINT = StackMark(OLLAMA.name, None, f"system_fingerprint {OLLAMA.system_fingerprint}")


def detect(obj: Any) -> StackMark | None:
    """The stack that produced this response body / stream chunk / model list, if it says."""
    if not isinstance(obj, dict):
        return None
    fp = obj.get("system_fingerprint")
    if fp == OLLAMA.system_fingerprint:
        return _OLLAMA_FINGERPRINT
    if isinstance(fp, str) and _LLAMACPP_BUILD.match(fp):
        return StackMark(LLAMACPP.name, fp, "system_fingerprint build string")
    if isinstance(obj.get("timings"), dict):
        return StackMark(LLAMACPP.name, None, "timings")
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "weight_version" in meta:
        return StackMark(SGLANG.name, None, "metadata.weight_version")
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        if "matched_stop" in choices[0]:
            return StackMark(SGLANG.name, None, "choices[].matched_stop")
        if "stop_reason" in choices[0]:
            return StackMark(VLLM.name, None, "choices[].stop_reason")
    if "kv_transfer_params" in obj or "prompt_logprobs" in obj:
        return StackMark(VLLM.name, None, "kv_transfer_params/prompt_logprobs")
    if "done" in obj and ("eval_count" in obj or "total_duration" in obj or "done_reason" in obj):
        return StackMark(OLLAMA.name, None, "native done/eval_count")
    kind = obj.get("object")
    if kind == "list":
        data = obj.get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict):
            owner = _OWNED_BY.get(str(data[0].get("owned_by", "")).lower())
            if owner:
                return StackMark(owner, None, f"owned_by {data[0].get('owned_by')}")
    # Most bodies are neither: skip the call (_from_error answers None for them too).
    return _from_error(obj) if "error" in obj or kind == "error" else None


def _from_error(obj: dict) -> StackMark | None:
    err = obj.get("error")
    if isinstance(err, str):
        if any(mark in err for mark in _OLLAMA_TEXTS):
            return StackMark(OLLAMA.name, None, "native error text")
        return None
    flat = obj.get("object") == "error"
    if not isinstance(err, dict) and not flat:
        return None
    e = err if isinstance(err, dict) else obj
    message = str(e.get("message") or "")
    for stack, texts, evidence in _REFUSAL_TEXTS:
        if any(mark in message for mark in texts):
            return StackMark(stack, None, evidence)
    if isinstance(err, dict) and isinstance(e.get("code"), int):
        if e.get("type") == "server_error" or (
            e.get("type") == "invalid_request_error" and e.get("code") in (400, 500, 501)
        ):
            return StackMark(LLAMACPP.name, None, "error with integer code and OpenAI type")
        if isinstance(e.get("type"), str) and e["type"].endswith("Error"):
            return StackMark(VLLM.name, None, "error type is a Python exception name")
    return None
