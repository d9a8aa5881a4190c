"""The harnesses the recipes cover, their pinned versions, and a cached virtualenv for each.

One place for the pins: the recipe checks (tests/recipes) install exactly these, each harness in
its own environment under ~/.cache/toolproxy-recipes/<harness>-<version>, so one harness's
dependencies never decide another's and a rerun starts in seconds. Run this file to build (or
show) one environment by hand: `python examples/recipes/harnesses.py openai-agents`.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("TOOLPROXY_RECIPES_CACHE", Path.home() / ".cache" / "toolproxy-recipes"))


@dataclass(frozen=True)
class Harness:
    name: str
    version: str
    requirements: tuple[str, ...]  # what pip installs, pinned to `version`


HARNESSES = {
    h.name: h
    for h in (
        Harness("openai-python", "3.57.0", ("openai==3.57.0",)),
        Harness("openai-agents", "0.24.0", ("openai-agents==0.24.0",)),
        Harness("pydantic-ai", "2.68.0", ("pydantic-ai-slim[openai]==2.68.0",)),
        Harness("langchain-openai", "1.7.4", ("langchain-openai==1.7.4",)),
        Harness("langgraph", "1.2.24", ("langgraph==1.2.24", "langchain-openai==1.7.4")),
        Harness("smolagents", "1.26.0", ("smolagents[openai]==1.26.0",)),
        Harness("mini-swe-agent", "2.4.6", ("mini-swe-agent==2.4.6",)),
        Harness("litellm", "1.110.2", ("litellm==1.110.2",)),
        Harness("ollama", "0.6.3", ("ollama==0.6.3",)),
        Harness("anthropic", "2.15.0", ("anthropic==2.15.0",)),
        # inspect-ai's openai-api/ and openai/ providers go through the openai SDK, which it does not pin
        Harness("inspect-ai", "0.3.285", ("inspect-ai==0.3.285", "openai==3.57.0")),
        Harness("dspy", "3.4.1", ("dspy==3.4.1",)),
        # qwen-agent, which bfcl-eval imports, imports soundfile without declaring it
        Harness("bfcl-eval", "2026.3.23", ("bfcl-eval==2026.3.23", "soundfile==0.14.0")),
    )
}


def environment(name: str) -> Path:
    """The harness's virtualenv, created with pip on first use; returns its root."""
    return build(HARNESSES[name])


def build(h: Harness) -> Path:
    """A virtualenv holding exactly `h.requirements` (other heavy test tools, e.g. an OTLP receiver, use it too)."""
    root = CACHE / f"{h.name}-{h.version}"
    ready = root / ".toolproxy-ready"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{root.name}.lock", "w") as lock:  # two checks building one environment wait for each other
        fcntl.flock(lock, fcntl.LOCK_EX)
        pins = " ".join(h.requirements) + "\n"
        if not ready.exists() or ready.read_text() != pins:  # new, or its pins changed since it was built
            if not (root / "bin" / "python").exists():
                subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
            subprocess.run(
                [
                    str(root / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    *h.requirements,
                ],
                check=True,
            )
            ready.write_text(pins)
    return root


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(HARNESSES):
        print(arg, environment(arg))
