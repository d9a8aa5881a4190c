r"""A small ReAct agent speaking OpenAI chat completions, to point at toolproxy.

    toolproxy serve --upstream http://127.0.0.1:11434 &
    python examples/react_agent.py --model qwen2.5:0.5b --run qwen-native --episodes 5
    toolproxy analyze && toolproxy report

or, with the proxy started for it (each condition its own run):

    toolproxy study --upstream URL --name react --conditions native,hint,text -- \
        python examples/react_agent.py --model M

The agent knows nothing about toolproxy: the only change is its base URL, which carries the run
and episode tags in a path prefix (`/t/run=NAME/episode=N/v1`). Under `toolproxy run` or
`study` it appends its episode and item tags to TOOLPROXY_BASE_URL, the tagged root they give
it, so the run and condition stay theirs. Tools run locally and their results go back as `tool`
messages, the way most harnesses do it. It uses the standard library only (no SDK to install), and
it resends a request once after a 408, 409, 429 or 5xx answer or a failed connection, as the openai
SDK does with max_retries=1.

Exit status: 0 every episode ended (with an answer or at the turn limit); 1 some episode ended on
an error answer from the server (each is printed, e.g. a stack that refuses tools) or on an
"answer" that is a tool call written as text (a server that did not extract it); 2 the proxy
could not be reached; 130 interrupted (Ctrl-C: one line, no traceback). Under `toolproxy study`
an exit of 1 is kept beside the cell as the harness's own verdict; the cell is measured all the same.
"""

from __future__ import annotations

import argparse
import ast
import http.client
import json
import operator
import os
import sys
import time
import urllib.error
import urllib.request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "unit_convert",
            "description": "Convert a value between km and miles.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "unit": {"type": "string", "enum": ["km", "mi"], "description": "the unit of value"},
                },
                "required": ["value", "unit"],
                "additionalProperties": False,
            },
        },
    },
]

TASKS = [
    "What is (17 * 23) + 11? Use the calculator.",
    "How many miles is 42.195 km?",
    "What is 2 to the power of 20, divided by 1024?",
    "Convert 26.2 miles to km, then add 10.",
    "What is the square of 12, minus 44?",
]

RETRY_STATUSES = {408, 409, 429}
TIMEOUT = 900.0  # seconds for one answer: a CPU model reads a long context slowly


class ServerError(Exception):
    """The server answered with an error status (or an unreadable body): this episode ends."""


class Unreachable(Exception):
    """No answer at all: every episode would fail the same way."""


class CallInText(Exception):
    """The final "answer" is one of our tool calls written as text: the server accepted the tools
    but did not turn the model's call into tool_calls, so the task was never done."""


# ---- the tools (the model's arguments are untrusted: bounded, and errors go back as text)

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise ValueError("exponent or base too large")
        return _OPS[type(node.op)](left, right)
    raise ValueError("only numbers, + - * / ** and parentheses are allowed")


def run_tool(name: str, args: dict) -> str:
    try:
        if name == "calculator":
            expr = str(args.get("expression", ""))
            if len(expr) > 200:
                return "error: expression too long"
            return str(_arith(ast.parse(expr, mode="eval").body))
        if name == "unit_convert":
            value, unit = float(args.get("value", 0)), args.get("unit")
            return f"{value / 1.609344:.4f} mi" if unit == "km" else f"{value * 1.609344:.4f} km"
    except (ValueError, TypeError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return f"error: no tool named {name!r}"


# ---- talking to the server


def _error_message(status: int, body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
        message = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        message = None
    text = message if isinstance(message, str) and message else body.decode("utf-8", "replace")
    return f"HTTP {status}: {' '.join(text.split())[:300]!r}"


def _open(url: str, body: dict, api_key: str):
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    for attempt in (1, 2):
        try:
            return urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=TIMEOUT)
        except urllib.error.HTTPError as exc:
            error = ServerError(_error_message(exc.code, exc.read()))
            retry = exc.code in RETRY_STATUSES or exc.code >= 500
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            error = Unreachable(f"cannot reach {url.split('/t/')[0]}: {getattr(reason, 'strerror', None) or reason}")
            retry = True
        if not retry or attempt == 2:
            raise error
        time.sleep(0.5)


def complete(base: str, api_key: str, model: str, messages: list, stream: bool) -> tuple[str, list[dict]]:
    """One chat completion: (content, tool calls as {id, type, function: {name, arguments}})."""
    body = {"model": model, "messages": messages, "tools": TOOLS}
    if stream:
        body["stream"] = True
    with _open(base + "/chat/completions", body, api_key) as resp:
        try:
            return _read_stream(resp) if stream else _read_message(resp.read())
        except (ValueError, AttributeError, TypeError, KeyError, IndexError) as exc:
            raise ServerError(f"the server's answer could not be read as a chat completion ({exc!r})") from None
        except (http.client.HTTPException, OSError) as exc:
            raise ServerError(f"the answer broke off ({type(exc).__name__})") from None


def _call(raw: dict, i: int) -> dict:
    fn = raw.get("function") or {}
    return {
        "id": raw.get("id") or f"call_{i}",
        "type": "function",
        "function": {"name": str(fn.get("name") or ""), "arguments": str(fn.get("arguments") or "")},
    }


def _read_message(body: bytes) -> tuple[str, list[dict]]:
    msg = json.loads(body)["choices"][0]["message"]
    return msg.get("content") or "", [_call(tc, i) for i, tc in enumerate(msg.get("tool_calls") or [])]


def _read_stream(resp) -> tuple[str, list[dict]]:
    content, calls = "", {}
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if not chunk.get("choices"):
            continue
        delta = chunk["choices"][0].get("delta") or {}
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            slot = calls.setdefault(tc.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}})
            slot["id"] = slot["id"] or tc.get("id")
            fn = tc.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""
    return content, [_call(c, i) for i, c in sorted(calls.items())]


# ---- the agent


def episode(base: str, api_key: str, model: str, task: str, max_turns: int, stream: bool) -> None:
    messages = [
        {"role": "system", "content": "You are a careful assistant. Use tools when they help."},
        {"role": "user", "content": task},
    ]
    for _ in range(max_turns):
        content, tool_calls = complete(base, api_key, model, messages, stream)
        messages.append({"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})})
        if not tool_calls:
            print(f"  answer: {content.strip()[:120]!r}")
            if call_in_text(content):
                raise CallInText(content.strip()[:120])
            return
        for tc in tool_calls:
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                args = {}
            if not isinstance(args, dict):
                args = {}
            result = run_tool(tc["function"]["name"], args)
            print(f"  {tc['function']['name']!r}({args}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
    print("  (gave up: turn limit)")


def call_in_text(content: str) -> bool:
    """Whether the text holds a call to one of TOOLS as JSON (bare, fenced or in <tool_call> tags)."""
    names = {t["function"]["name"] for t in TOOLS}
    decoder = json.JSONDecoder()
    start = content.find("{")
    while start >= 0:
        try:
            obj, _ = decoder.raw_decode(content, start)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            fn = obj.get("function") if isinstance(obj.get("function"), dict) else obj
            if fn.get("name") in names:
                return True
        start = content.find("{", start + 1)
    return False


def base_url(args: argparse.Namespace, i: int) -> str:
    """The tagged base URL of episode i: under toolproxy run/study their tagged root, else --proxy with --run."""
    tags = f"episode={i}/item=task_{i % len(TASKS)}" + (f"/condition={args.condition}" if args.condition else "")
    root = os.environ.get("TOOLPROXY_BASE_URL")
    if root and args.proxy is None:
        return f"{root.rstrip('/')}{f'/run={args.run}' if args.run else ''}/{tags}/v1"
    return f"{(args.proxy or 'http://127.0.0.1:8787').rstrip('/')}/t/run={args.run or 'react'}/{tags}/v1"


def main() -> int:
    try:
        return agent()
    except KeyboardInterrupt:
        print("react_agent: interrupted", file=sys.stderr, flush=True)
        return 130


def agent() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--proxy",
        default=None,
        help="toolproxy address (default: TOOLPROXY_BASE_URL when toolproxy run/study set it, else http://127.0.0.1:8787)",
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--run", default=None, help="run tag (default: react; under toolproxy run/study, theirs)")
    ap.add_argument("--condition", default=None, help="native|hint|text|constrained|template (tag per request)")
    ap.add_argument("--episodes", type=int, default=len(TASKS))
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--api-key", default="unused-by-local-servers")
    args = ap.parse_args()
    failed: list[str] = []
    in_text = 0
    for i in range(args.episodes):
        task = TASKS[i % len(TASKS)]
        print(f"episode {i}: {task}", flush=True)
        try:
            episode(base_url(args, i), args.api_key, args.model, task, args.max_turns, args.stream)
        except ServerError as exc:
            print(f"  the server answered an error: {exc}", flush=True)
            failed.append(str(exc))
        except CallInText:
            print("  that is a tool call written as text, not an answer: the server did not extract it", flush=True)
            in_text += 1
        except Unreachable as exc:
            print(f"react_agent: {exc}. Is toolproxy running there?", file=sys.stderr)
            return 2
    if failed:
        print(
            f"react_agent: {len(failed)} of {args.episodes} episodes ended on a server error; the first: {failed[0]}",
            file=sys.stderr,
        )
    if in_text:
        print(
            f"react_agent: {in_text} of {args.episodes} episodes ended on a tool call left in text (the server "
            "returned it as content, not tool_calls: a missing or mismatched tool-call parser; "
            "`toolproxy doctor` names the fix)",
            file=sys.stderr,
        )
    return 1 if failed or in_text else 0


if __name__ == "__main__":
    sys.exit(main())
