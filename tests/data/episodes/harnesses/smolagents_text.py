"""smolagents: a ToolCallingAgent with max_steps=1 whose one call comes back written in the text (the
stack left it there; smolagents parses it itself and runs it), so the step limit is reached right
after the call ran and smolagents sends its wrap-up request (a new system prompt, no tools, the call
written back as "Calling tools:" text)."""

from __future__ import annotations

import smolagents
from common import Log, arguments, weather
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

LOG: Log | None = None


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: City name
    """
    result = weather(city)
    LOG.executed("tool-calling", "get_weather", {"city": city}, result)
    return result


def main() -> None:
    global LOG
    args = arguments(__doc__.splitlines()[0])
    LOG = Log(args.record, f"smolagents {smolagents.__version__}")
    extra = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    model = OpenAIServerModel(model_id=args.model, api_base=args.base_url, api_key="sk-capture", **extra)
    agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=1, verbosity_level=0)
    task = "What is the weather in Paris?"
    try:
        result = agent.run(task, return_full_result=True)
        steps = [
            {
                "kind": type(s).__name__,
                "tool_calls": [[c.name, c.arguments] for c in getattr(s, "tool_calls", None) or []],
                "observations": getattr(s, "observations", None),
                "output": getattr(s, "output", None),
            }
            for s in agent.memory.steps
        ]
        LOG.episode("tool-calling", task, result.output, state=result.state, steps=steps)
    except Exception as exc:  # the traffic is what we keep
        LOG.episode("tool-calling", task, None, error=f"{type(exc).__name__}: {exc}")
    LOG.write()


if __name__ == "__main__":
    main()
