"""inspect-ai: one sample with one tool, epochs=3 (inspect runs the epochs at the same time)."""

from __future__ import annotations

import os
import sys

import inspect_ai
from common import Log, arguments, weather
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.solver._task_state import sample_state
from inspect_ai.tool import tool

LOG: Log | None = None


@tool
def get_weather():
    async def execute(city: str) -> str:
        """Current weather for a city.

        Args:
            city: City name
        """
        state = sample_state()
        result = weather(city)
        LOG.executed(f"epoch-{state.epoch}" if state else "?", "get_weather", {"city": city}, result)
        return result

    return execute


def main() -> None:
    global LOG
    args = arguments(__doc__.splitlines()[0])
    LOG = Log(args.record, f"inspect-ai {inspect_ai.__version__}")
    # openai-api/<service>/<model>: <SERVICE>_BASE_URL and <SERVICE>_API_KEY say where and with what key
    os.environ["CAPTURE_BASE_URL"] = args.base_url
    os.environ["CAPTURE_API_KEY"] = "sk-capture"
    task = Task(
        dataset=[Sample(input="What is the weather in Paris?", target="sunny")],
        solver=[use_tools(get_weather()), generate()],
        scorer=includes(),
        epochs=3,
    )
    config = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    logs = inspect_eval(
        task,
        model=f"openai-api/capture/{args.model}",
        log_dir=os.path.dirname(args.record) + "/inspect-logs",
        display="none",
        max_retries=0,
        **config,
    )
    for sample in logs[0].samples or []:
        LOG.episode(
            f"epoch-{sample.epoch}",
            sample.input,
            sample.output.completion if sample.output else None,
            score=str(next(iter(sample.scores.values())).value) if sample.scores else None,
            steps=[
                {
                    "role": m.role,
                    "text": m.text,
                    "tool_calls": [[c.function, c.arguments, c.id] for c in (getattr(m, "tool_calls", None) or [])],
                }
                for m in sample.messages
            ],
        )
    LOG.write()
    sys.exit(0 if logs[0].status == "success" else 1)


if __name__ == "__main__":
    main()
