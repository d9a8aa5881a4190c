"""The one-tool task every recipe gives its harness: ask for the weather, call the tool, answer.

The tool's result carries a fixed phrase, so an answer that repeats it shows the harness ran the
tool and fed its result back to the model; the recipe checks look for exactly that.
"""

QUESTION = "What is the weather in Paris right now? Use the get_weather tool."
SYSTEM = "You are a helpful assistant. Use a tool when one fits the question."
DESCRIPTION = "Current weather for a city."
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
              "required": ["city"]}
RESULT_PHRASE = "sunny, 22 C"


def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"weather-service: {RESULT_PHRASE} in {city}"


CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": DESCRIPTION,
                                              "parameters": PARAMETERS}}


def finish(answer: str | None, tool_ran: bool) -> None:
    """Print the harness's final answer and exit 0 only when the tool ran and an answer came back."""
    print(f"final answer: {answer!r}")
    if not tool_ran:
        raise SystemExit("the harness never ran get_weather (no valid call reached it)")
    if not answer:
        raise SystemExit("the harness ran the tool but got no final answer")
