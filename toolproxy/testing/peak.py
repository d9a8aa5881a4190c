"""A CLI run's peak RSS, as the run itself measured it.

wait4's ru_maxrss is no good for this: Linux carries the forking parent's high-water mark into the
child across exec, so the child of a large process (a pytest-xdist worker grown to ~270 MB, a
benchmark that has just generated its corpus in memory) "peaks" at its parent's size whatever it
did. So the command runs under a small wrapper that writes, at exit, its own VmHWM from
/proc/self/status (reset by exec) and the largest ru_maxrss of its own children (analyze's
workers, the analyze that export runs first), which it forked while small.
"""

from __future__ import annotations

from pathlib import Path

_WRAPPER = """
import atexit, resource, runpy, sys
out = sys.argv[1]
def peak():
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(out, "w") as f:
        f.write(str(max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)))
atexit.register(peak)
sys.argv = ["toolproxy", *sys.argv[2:]]
runpy.run_module("toolproxy.cli", run_name="__main__", alter_sys=True)
"""


def command(python: str, out: Path, *args: str) -> list[str]:
    """argv that runs `toolproxy ARGS` with `python` (any interpreter with toolproxy installed) and
    leaves its peak RSS in `out`."""
    out.unlink(missing_ok=True)
    return [python, "-c", _WRAPPER, str(out), *args]


def read_mb(out: Path) -> float:
    """The peak RSS `command` left in `out`, in MB."""
    return int(out.read_text()) / 1024
