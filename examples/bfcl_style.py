"""A small BFCL-style run through toolproxy: single-turn items, some where no offered tool fits.

    toolproxy serve --upstream http://127.0.0.1:8080 &
    python examples/bfcl_style.py --proxy http://127.0.0.1:8787 --conditions native,text,constrained
    toolproxy analyze && toolproxy report && toolproxy compare bfcl-native bfcl-text

Each item is asked once per condition through the same unmodified openai-SDK harness; the
condition rides in the path tag (`condition=`), and so does what the item expects (`expect=call`
for items with a fitting tool, `expect=none` for the irrelevance items), so the analyzer scores the
irrelevance items by restraint. The script then scores what the harness itself received, the way
a benchmark's checker would: the right function with the right arguments in `tool_calls`, or no
call at all for an irrelevance item. toolproxy's delivered fidelity should rank the conditions
the same way; its call fidelity may not, because it also counts calls the stack left in text.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from openai import OpenAI


def tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


WEATHER = tool(
    "get_weather",
    "Current weather for a city.",
    {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    ["city"],
)
STOCK = tool("get_stock_price", "Latest stock price for a ticker symbol.", {"symbol": {"type": "string"}}, ["symbol"])
CURRENCY = tool(
    "convert_currency",
    "Convert an amount of money between two currencies (ISO codes).",
    {"amount": {"type": "number"}, "from_currency": {"type": "string"}, "to_currency": {"type": "string"}},
    ["amount", "from_currency", "to_currency"],
)
AREA = tool(
    "rectangle_area",
    "Area of a rectangle.",
    {"width": {"type": "number"}, "height": {"type": "number"}},
    ["width", "height"],
)
TRANSLATE = tool(
    "translate",
    "Translate text into a target language.",
    {"text": {"type": "string"}, "target_language": {"type": "string"}},
    ["text", "target_language"],
)

# (item id, question, offered tools, expected call as (name, {argument: accepted values}) or None)
ITEMS: list[tuple[str, str, list[dict], tuple[str, dict[str, list[Any]]] | None]] = [
    ("simple_0", "What's the weather like in Paris right now?", [WEATHER], ("get_weather", {"city": ["Paris"]})),
    ("simple_1", "What is the current stock price of AAPL?", [STOCK], ("get_stock_price", {"symbol": ["AAPL"]})),
    (
        "simple_2",
        "Convert 100 US dollars to euros.",
        [CURRENCY],
        ("convert_currency", {"amount": [100], "from_currency": ["USD"], "to_currency": ["EUR"]}),
    ),
    (
        "simple_3",
        "What is the area of a rectangle 3 meters wide and 4 meters high?",
        [AREA],
        ("rectangle_area", {"width": [3], "height": [4]}),
    ),
    (
        "multiple_0",
        "Translate 'good morning' into Spanish.",
        [WEATHER, TRANSLATE, STOCK],
        ("translate", {"text": ["good morning"], "target_language": ["Spanish", "es"]}),
    ),
    (
        "multiple_1",
        "How is the weather in Tokyo, in celsius?",
        [STOCK, WEATHER, CURRENCY],
        ("get_weather", {"city": ["Tokyo"], "unit": ["celsius"]}),
    ),
    (
        "multiple_2",
        "Give me the stock price for MSFT.",
        [CURRENCY, STOCK, AREA],
        ("get_stock_price", {"symbol": ["MSFT"]}),
    ),
    (
        "multiple_3",
        "How many Japanese yen is 50 British pounds?",
        [WEATHER, CURRENCY, TRANSLATE],
        ("convert_currency", {"amount": [50], "from_currency": ["GBP"], "to_currency": ["JPY"]}),
    ),
    (
        "multiple_4",
        "A rectangle is 2.5 wide and 10 high. What is its area?",
        [TRANSLATE, AREA],
        ("rectangle_area", {"width": [2.5], "height": [10]}),
    ),
    ("irrelevance_0", "Who wrote the play Hamlet?", [WEATHER], None),
    ("irrelevance_1", "What is the capital city of Japan?", [STOCK, CURRENCY], None),
    ("irrelevance_2", "Tell me a short joke about cats.", [AREA], None),
]


def _same(value: Any, accepted: list[Any]) -> bool:
    for a in accepted:
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value - a) < 1e-9:
                return True
        elif isinstance(value, str) and value.strip().lower() == str(a).lower():
            return True
    return False


def received_correctly(message, expected) -> bool:
    """What a BFCL-style checker says about what the harness received (not what the model wrote)."""
    calls = message.tool_calls or []
    if expected is None:
        return not calls
    if len(calls) != 1 or calls[0].function.name != expected[0]:
        return False
    try:
        args = json.loads(calls[0].function.arguments or "{}")
    except json.JSONDecodeError:
        return False
    return isinstance(args, dict) and all(k in args and _same(args[k], v) for k, v in expected[1].items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxy", default="http://127.0.0.1:8787", help="toolproxy address")
    ap.add_argument("--model", default="local")
    ap.add_argument("--conditions", default="native,text,constrained")
    ap.add_argument("--prefix", default="bfcl", help="run names are PREFIX-CONDITION")
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    totals = {}
    for condition in args.conditions.split(","):
        passed = 0
        for item, question, tools, expected in ITEMS:
            category = item.split("_")[0]
            expect = "none" if expected is None else "call"
            base = (
                f"{args.proxy}/t/run={args.prefix}-{condition}/episode={item}/item={item}/category={category}"
                f"/expect={expect}/condition={condition}/v1"
            )
            client = OpenAI(base_url=base, api_key="unused-by-local-servers", max_retries=0, timeout=600)
            try:
                message = (
                    client.chat.completions.create(
                        model=args.model,
                        messages=[{"role": "user", "content": question}],
                        tools=tools,
                        temperature=0,
                        max_tokens=args.max_tokens,
                    )
                    .choices[0]
                    .message
                )
                ok = received_correctly(message, expected)
                got = [f"{c.function.name}({c.function.arguments})" for c in message.tool_calls or []] or [
                    repr((message.content or "")[:60])
                ]
            except Exception as exc:  # the harness's view: an error is a miss, whatever caused it
                ok, got = False, [f"{type(exc).__name__}"]
            passed += ok
            print(f"{condition:<12} {item:<14} {'PASS' if ok else 'fail'}  {' '.join(got)}", flush=True)
        totals[condition] = passed
    print()
    for condition, passed in totals.items():
        print(f"harness received correctly under {condition}: {passed}/{len(ITEMS)}")


if __name__ == "__main__":
    main()
