"""dspy: ReAct over one tool (the tool list and the calls travel in the prompt's fields)."""

from __future__ import annotations

import dspy
from common import Log, arguments, weather

TASK = "What is the weather in Paris?"


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    log = Log(args.record, f"dspy {dspy.__version__}")

    def get_weather(city: str) -> str:
        """Current weather for a city."""
        result = weather(city)
        log.executed("task-0", "get_weather", {"city": city}, result)
        return result

    extra = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    lm = dspy.LM(
        f"openai/{args.model}", api_base=args.base_url, api_key="sk-capture", cache=False, num_retries=0, **extra
    )
    dspy.configure(lm=lm)
    agent = dspy.ReAct("question -> answer", tools=[get_weather], max_iters=4)
    try:
        pred = agent(question=TASK)
        log.episode("task-0", TASK, pred.answer, trajectory=pred.trajectory)
    except Exception as exc:  # a real model may break the agent; the traffic is what we keep
        log.episode("task-0", TASK, None, error=f"{type(exc).__name__}: {exc}")
    log.write()


if __name__ == "__main__":
    main()
