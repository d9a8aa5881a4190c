"""The scripted model behind the recipe checks: it does the one-tool task right, on any protocol.

It calls get_weather for the city asked about until the tool's result phrase shows up in the
conversation, then answers (through smolagents' final_answer or inspect-ai's submit tool when
one is offered, since that is how those agents stop). Offered no tools but a prompt protocol
(dspy's ReAct fields), it writes its choice into those fields the same way. Given
only mini-swe-agent's `bash` tool, it runs a command whose output holds the phrase (the shell must
compute part of it, so the phrase appears only if the harness really ran it), then submits the
answer the way mini-swe-agent ends a task. Offered other tools only (BFCL), it calls the first with
arguments that satisfy its schema, so a run through a correct harness and proxy scores full call
fidelity: anything less is a real defect.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from toolproxy.emulators import ModelRequest, ScriptedReply, call, text

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "recipes"))
from weather import RESULT_PHRASE  # noqa: E402

ANSWER = f"It is {RESULT_PHRASE} in Paris."
_CITY = re.compile(r"weather in ([A-Z][\w-]*)")


def _city(body: dict) -> str:
    found = _CITY.search(json.dumps(body))
    return found.group(1) if found else "Paris"


def _fields(**values: str) -> str:
    """dspy's ChatAdapter output: each field under its `[[ ## name ## ]]` header, then the end marker."""
    return "".join(f"[[ ## {k} ## ]]\n{v}\n\n" for k, v in values.items()) + "[[ ## completed ## ]]\n"


def _prompt_protocol(req: ModelRequest, done: bool) -> ScriptedReply | None:
    """dspy ReAct's step and extract prompts (its tools are listed in the system text)."""
    system = next((m.get("content") for m in req.messages if m.get("role") == "system"), None) or ""
    if "[[ ## next_tool_name ## ]]" in system:
        if done:
            return text(_fields(next_thought="I have the weather.", next_tool_name="finish", next_tool_args="{}"))
        return text(
            _fields(
                next_thought="I need the weather.",
                next_tool_name="get_weather",
                next_tool_args=json.dumps({"city": _city(req.body)}),
            )
        )
    if "[[ ## answer ## ]]" in system:
        return text(_fields(reasoning="The tool said so.", answer=ANSWER))
    return None


def _schemas(body: dict) -> dict[str, dict]:
    out = {}
    for t in body.get("tools") or []:
        if isinstance(t, dict):
            fn = t.get("function", t)
            out[fn.get("name", "")] = fn.get("parameters") or fn.get("input_schema") or {}
    return out


def example(schema: Any) -> Any:
    """A value that satisfies `schema`: required properties filled, the first enum value, by type."""
    if not isinstance(schema, dict):
        return "x"
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: example(props.get(k, {})) for k in schema.get("required") or []}
    if kind == "array":
        return [example(schema.get("items", {}))] if schema.get("minItems") else []
    return {"integer": 1, "number": 1.5, "boolean": True, "null": None}.get(kind, "Paris")


def respond(req: ModelRequest) -> ScriptedReply | None:
    tools = _schemas(req.body)
    done = RESULT_PHRASE in json.dumps(req.body)
    if not tools:
        return _prompt_protocol(req, done) or text(ANSWER)
    if set(tools) == {"bash"}:
        if done:
            return call("bash", {"command": f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo '{ANSWER}'"})
        return call("bash", {"command": 'echo "weather-service: sunny, $((20 + 2)) C in Paris"'})
    if done:
        for name in ("final_answer", "submit"):
            if name in tools:
                return call(name, {"answer": ANSWER})
        return text(ANSWER)
    if "get_weather" in tools:
        return call("get_weather", {"city": _city(req.body)})
    name = next(iter(tools))
    return call(name, example(tools[name]))
