"""The scripted models behind the emulated captures: each does its task the way the case needs,
reading only the request (so concurrent episodes each get the reply their own state calls for)."""

from __future__ import annotations

import json

from toolproxy.emulators import ModelRequest, ScriptedReply, call, text

ANSWER = "It is sunny, 21 C in Paris."


def _flat(req: ModelRequest) -> str:
    return json.dumps(req.messages)


def _has_tool_result(req: ModelRequest) -> bool:
    return any(isinstance(m, dict) and m.get("role") == "tool" for m in req.messages)


def weather_chat(req: ModelRequest) -> ScriptedReply:
    """Calls get_weather(Paris), then answers once the result is in the conversation."""
    return text(ANSWER) if _has_tool_result(req) else call("get_weather", {"city": "Paris"})


def empty_once(req: ModelRequest) -> ScriptedReply:
    """Calls, then replies with nothing (as a small model that emits only its end token does), and
    answers once the harness has asked again."""
    if not _has_tool_result(req):
        return call("get_weather", {"city": "Paris"})
    return text(ANSWER) if "Please return text or call a tool" in _flat(req) else text("")


def empty_after_result(req: ModelRequest) -> ScriptedReply:
    """Calls get_weather(Paris), then replies with nothing once the result is in (a small model that
    emits only its end token): the harness takes the empty reply as its answer."""
    return text("") if _has_tool_result(req) else call("get_weather", {"city": "Paris"})


def smolagents_text(req: ModelRequest) -> ScriptedReply:
    """A call written as JSON in the reply text (no stack parser turns it into a call; smolagents
    parses it itself), then at max_steps the wrap-up answered in prose."""
    if not req.tools:
        return text(ANSWER)
    return text('{"name": "get_weather", "arguments": {"city": "Paris"}}')


def smolagents_steps(req: ModelRequest) -> ScriptedReply:
    """ToolCallingAgent: a call, then "Action:" with nothing after it (smolagents cannot parse it),
    then at max_steps its summary request, answered in prose. CodeAgent: code that calls the tool
    and prints, then code that calls final_answer."""
    flat = _flat(req)
    if not req.tools:
        if "using code blobs" in flat:
            if "Observation:" in flat and "rain, 9 C" in flat:
                return text('Thought: I have the weather.\n<code>\nfinal_answer("It rains in Oslo, 9 C.")\n</code>')
            return text(
                'Thought: I will look the weather up with the tool.\n<code>\nweather = get_weather(city="Oslo")\n'
                "print(weather)\n</code>"
            )
        return text(ANSWER)  # the summary smolagents asks for at max_steps
    if "sunny, 21 C" in flat:
        return text("Action:\n")
    return call("get_weather", {"city": "Paris"})


def dspy_react(req: ModelRequest) -> ScriptedReply:
    """dspy ChatAdapter fields: get_weather, then finish, then the extract step's answer."""
    system = req.messages[0].get("content", "") if req.messages else ""
    user = req.messages[-1].get("content", "") if req.messages else ""
    if "next_tool_name" in system:
        if "[[ ## observation_0 ## ]]" in user:
            return text(
                "[[ ## next_thought ## ]]\nI have the weather in Paris.\n\n[[ ## next_tool_name ## ]]\nfinish\n\n"
                "[[ ## next_tool_args ## ]]\n{}\n\n[[ ## completed ## ]]"
            )
        return text(
            "[[ ## next_thought ## ]]\nI should look up the weather in Paris.\n\n[[ ## next_tool_name ## ]]\n"
            'get_weather\n\n[[ ## next_tool_args ## ]]\n{"city": "Paris"}\n\n[[ ## completed ## ]]'
        )
    return text(
        f"[[ ## reasoning ## ]]\nThe tool said sunny, 21 C.\n\n[[ ## answer ## ]]\n{ANSWER}\n\n[[ ## completed ## ]]"
    )


def langchain_react(req: ModelRequest) -> ScriptedReply:
    """The classic ReAct text protocol: an Action, then the Final Answer after the Observation."""
    if "Observation: sunny" in _flat(req):
        return text(f" I now know the final answer\nFinal Answer: {ANSWER}")
    return text(" I should look up the weather in Paris.\nAction: get_weather\nAction Input: Paris")


MODELS = {
    "empty_after_result": empty_after_result,
    "smolagents_text": smolagents_text,
    "weather_chat": weather_chat,
    "empty_once": empty_once,
    "smolagents_steps": smolagents_steps,
    "dspy_react": dspy_react,
    "langchain_react": langchain_react,
}
