"""dspy: a ReAct module with one tool, on chat completions through `dspy.LM("openai/MODEL")`.

    toolproxy run --upstream URL --run dspy -- python examples/recipes/dspy-react.py [openai/MODEL]

dspy's openai/ models read OPENAI_BASE_URL (then OPENAI_API_BASE) and OPENAI_API_KEY, which
`toolproxy run` sets. ReAct sends no `tools`: it writes the tool list into its prompt and reads
the model's choice back from fields (`[[ ## next_tool_name ## ]]`, `[[ ## next_tool_args ## ]]`),
then asks once more, without the tool list, for the final answer. Its cache is off, so every step
reaches the proxy.
"""

import sys

import dspy
from weather import QUESTION, finish
from weather import get_weather as weather_service

calls = []


def get_weather(city: str) -> str:
    """Current weather for a city."""
    calls.append(city)
    return weather_service(city)


dspy.configure(lm=dspy.LM(sys.argv[1] if len(sys.argv) > 1 else "openai/local", cache=False, num_retries=0))
agent = dspy.ReAct("question -> answer", tools=[get_weather], max_iters=4)
prediction = agent(question=QUESTION)
# ReAct extracts an answer whether the model chose `finish` or ran out of iterations
chose = [v for k, v in prediction.trajectory.items() if k.startswith("tool_name_")]
finish(prediction.answer, bool(calls), None if "finish" in chose else "max_iters")
