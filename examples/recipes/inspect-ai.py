"""inspect-ai: one sample solved by its ReAct agent with one tool, scored by inclusion of the answer.

    toolproxy run --upstream URL --run inspect -- python examples/recipes/inspect-ai.py [openai-api/llm/MODEL]
    toolproxy run --upstream URL --run inspect-responses -- python examples/recipes/inspect-ai.py openai/MODEL

`openai-api/SERVICE/MODEL` speaks chat completions to SERVICE_BASE_URL with SERVICE_API_KEY:
`toolproxy run` sets LLM_BASE_URL and LLM_API_KEY, so use the service name `llm`. `openai/MODEL`
reads OPENAI_BASE_URL and OPENAI_API_KEY and, for a model name it does not know, speaks the
Responses API, after a probe request (`Please say 'hello, world'`, asking for reasoning
summaries) that toolproxy records but does not count as an episode. Logs go to ./logs.
"""

import sys

from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.tool import tool
from weather import QUESTION, RESULT_PHRASE, SYSTEM, finish
from weather import get_weather as weather_service

calls = []


@tool
def get_weather():
    async def execute(city: str) -> str:
        """Current weather for a city.

        Args:
            city: City name
        """
        calls.append(city)
        return weather_service(city)

    return execute


task = Task(
    dataset=[Sample(input=QUESTION, target=RESULT_PHRASE)],
    solver=react(prompt=SYSTEM, tools=[get_weather()], attempts=1),
    scorer=includes(),
    message_limit=8,
)
log = inspect_eval(
    task,
    model=sys.argv[1] if len(sys.argv) > 1 else "openai-api/llm/local",
    display="none",
    log_dir="logs",
    max_retries=0,
)[0]
sample = (log.samples or [None])[0]
# a sample that hit a limit ended there, its completion the last text whether the agent submitted or not
limit = sample.limit.type if sample is not None and sample.limit is not None else None
finish(
    sample.output.completion if sample is not None and log.status == "success" else None,
    bool(calls),
    f"{limit} limit" if limit else None,
)
