"""smolagents: a ToolCallingAgent that reaches max_steps (one reply of its is text the harness
cannot parse), then a CodeAgent (tools as Python functions in the prompt, calls in code)."""

from __future__ import annotations

import smolagents
from common import Log, arguments, weather
from smolagents import CodeAgent, OpenAIServerModel, ToolCallingAgent, tool

LOG: Log | None = None
CURRENT = {"episode": "?"}


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: City name
    """
    result = weather(city)
    LOG.executed(CURRENT["episode"], "get_weather", {"city": city}, result)
    return result


def steps(agent) -> list[dict]:
    out = []
    for s in agent.memory.steps:
        kind = type(s).__name__
        entry = {"kind": kind}
        if kind == "ActionStep":
            entry.update(
                step=s.step_number,
                tool_calls=[[c.name, c.arguments] for c in s.tool_calls or []],
                error=str(s.error) if s.error else None,
                observations=s.observations,
                code=getattr(s, "code_action", None),
                is_final_answer=s.is_final_answer,
            )
        elif kind == "FinalAnswerStep":
            entry.update(output=s.output)
        out.append(entry)
    return out


def main() -> None:
    global LOG
    args = arguments(__doc__.splitlines()[0])
    LOG = Log(args.record, f"smolagents {smolagents.__version__}")
    extra = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    model = OpenAIServerModel(model_id=args.model, api_base=args.base_url, api_key="sk-capture", **extra)
    for name, make, task in [
        (
            "tool-calling",
            lambda: ToolCallingAgent(tools=[get_weather], model=model, max_steps=2, verbosity_level=0),
            "What is the weather in Paris?",
        ),
        (
            "code",
            lambda: CodeAgent(tools=[get_weather], model=model, max_steps=3, verbosity_level=0),
            "What is the weather in Oslo?",
        ),
    ]:
        CURRENT["episode"] = name
        agent = make()
        try:
            result = agent.run(task, return_full_result=True)
            LOG.episode(name, task, result.output, state=result.state, steps=steps(agent))
        except Exception as exc:  # a real model may break the agent; the traffic is what we keep
            LOG.episode(name, task, None, error=f"{type(exc).__name__}: {exc}", steps=steps(agent))
    LOG.write()


if __name__ == "__main__":
    main()
