"""What every capture harness shares: the tool, the harness's own execution log, the arguments.

Runs inside each harness's virtualenv (no toolproxy there): standard library only.
"""

from __future__ import annotations

import argparse
import json
import threading

WEATHER = {"Paris": "sunny, 21 C", "Oslo": "rain, 9 C"}
_lock = threading.Lock()


class Log:
    """The harness's own record: one entry per real tool execution (who ran it, with what), and per
    episode what the harness itself ended with. Written as one JSON document at the end."""

    def __init__(self, path: str, harness: str) -> None:
        self.path = path
        self.doc = {"harness": harness, "executions": [], "episodes": []}

    def executed(self, episode: str, tool: str, args: dict, result: str) -> None:
        with _lock:
            self.doc["executions"].append({"episode": episode, "tool": tool, "args": args, "result": result})

    def episode(self, episode: str, task: str, answer, **extra) -> None:
        with _lock:
            self.doc["episodes"].append({"episode": episode, "task": task, "answer": answer, **extra})

    def write(self) -> None:
        self.doc["episodes"].sort(key=lambda e: e["episode"])
        with open(self.path, "w") as f:
            json.dump(self.doc, f, indent=1, default=repr, sort_keys=True)
            f.write("\n")


def weather(city) -> str:
    return WEATHER.get(city, "unknown") if isinstance(city, str) else f"error: city must be a string, got {city!r}"


def arguments(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--base-url", required=True, help="the proxy's address followed by /v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--record", required=True, help="where the harness's own record goes (JSON)")
    ap.add_argument("--max-tokens", type=int, default=None, help="reply cap (the real stack)")
    return ap.parse_args()
