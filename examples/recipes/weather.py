"""The one-tool task every recipe gives its harness: ask for the weather, call the tool, answer.

The tool's result carries a fixed phrase, so an answer that repeats it shows the harness ran the
tool and fed its result back to the model; the recipe checks look for exactly that.

`WEATHER_CITY` picks the city asked about (Paris unless set). With `WEATHER_TRUTH_LOG` set to a
file, every real execution of the tool and the harness's final answer (and whether the agent ended
the task itself or a limit of the harness did) are appended to it as JSON lines: the harness's own
record of what it did, which tests/recipes/truth.py sets beside toolproxy's numbers.
"""

import json
import os

CITY = os.environ.get("WEATHER_CITY") or "Paris"
QUESTION = f"What is the weather in {CITY} right now? Use the get_weather tool."
SYSTEM = "You are a helpful assistant. Use a tool when one fits the question."
DESCRIPTION = "Current weather for a city."
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}},
    "required": ["city"],
}
RESULT_PHRASE = "sunny, 22 C"


def _truth(event: str, **fields) -> None:
    path = os.environ.get("WEATHER_TRUTH_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def get_weather(city: str) -> str:
    """Current weather for a city."""
    _truth("tool", city=city)
    return f"weather-service: {RESULT_PHRASE} in {city}"


CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": DESCRIPTION, "parameters": PARAMETERS},
}


def finish(answer, tool_ran: bool, stopped: str | None = None) -> None:
    """Print the harness's final answer and exit 0 only when the tool ran and an answer came back.
    `stopped`: what ended the task when the agent did not end it itself (a step or message limit,
    after which the harness wraps up on its own), as the harness reports it."""
    answer = None if answer is None else str(answer)
    _truth("answer", answer=answer, tool_ran=tool_ran, stopped=stopped)
    print(f"final answer: {answer!r}")
    if not tool_ran:
        raise SystemExit("the harness never ran get_weather (no valid call reached it)")
    if not answer:
        raise SystemExit("the harness ran the tool but got no final answer")
