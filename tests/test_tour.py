"""README's tour as a newcomer runs it: an emulated llama.cpp and `toolproxy serve` started back to
back, the example agent driven through the proxy, the live page opened while it runs.

It showed prose 5/5 and no call at all (the emulator's default reply is a greeting), the agent was
done in a fraction of a second, so the page could not be opened "while it runs", and the stats
kept `stack: unreachable` although the stack was up by the time the agent ran."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from proxyprocess import ProxyProcess

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "examples" / "react_agent.py"


def _tour_emulator_args() -> list[str]:
    """The emulator's arguments in README's tour, as written there."""
    (line,) = re.findall(r"^\s*python -m toolproxy\.emulators (.+?) &$", (ROOT / "README.md").read_text(), re.M)
    return shlex.split(line)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, accept: str | None = None) -> tuple[str, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=20) as r:
        return r.headers.get("Content-Type", ""), r.read()


def test_the_tour_shows_calls_while_the_agent_runs_and_names_the_stack(tmp_path):
    args = _tour_emulator_args()
    port = _free_port()
    args[args.index("--port") + 1] = str(port)
    # serve first and the emulator a moment later, as `cmd & cmd &` may well start them: the
    # proxy's first fingerprint finds nothing listening.
    proxy = ProxyProcess(f"http://127.0.0.1:{port}", tmp_path / "data")
    emulator = None
    try:
        deadline = time.monotonic() + 60
        while (proxy.stats().get("stack") or {}).get("stack") != "unreachable":
            assert time.monotonic() < deadline, proxy.stats()
            time.sleep(0.1)
        emulator = subprocess.Popen(
            [sys.executable, "-m", "toolproxy.emulators", *args], stdout=subprocess.PIPE, text=True
        )
        assert "listening on" in emulator.stdout.readline()
        agent = subprocess.Popen(
            [sys.executable, str(AGENT), "--model", "m", "--run", "tour", "--proxy", proxy.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen_while_running = None
        while agent.poll() is None:
            live = json.loads(_get(proxy.url + "/_toolproxy/live")[1])
            if (live.get("runs") or {}).get("tour", {}).get("exchanges") and agent.poll() is None:
                seen_while_running = live["runs"]["tour"]
            time.sleep(0.1)
        out, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, out + err
        assert seen_while_running is not None, "the agent was done before the page could show its run"
        live = json.loads(_get(proxy.url + "/_toolproxy/live")[1])
        outcomes = live["runs"]["tour"]["outcomes"]
        assert any(k.startswith("valid_call") for k in outcomes), outcomes
        # The stack answered by the time the agent ran: the stats say which it is.
        deadline = time.monotonic() + 60
        while (stack := (proxy.stats().get("stack") or {}).get("stack")) != "llamacpp":
            assert time.monotonic() < deadline, stack
            time.sleep(0.2)
        # What `curl` gets there, and what a browser gets: README says both.
        assert _get(proxy.url + "/_toolproxy/")[0].startswith("application/json")
        assert _get(proxy.url + "/_toolproxy/", "text/html")[0].startswith("text/html")
    finally:
        if emulator is not None:
            emulator.terminate()
            emulator.wait(30)
        proxy.stop()
