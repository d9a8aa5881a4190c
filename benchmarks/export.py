"""How long `toolproxy export` takes: a first export, a second one with nothing new, and one after
new traffic, on a synthetic data directory (the analyzer benchmark's generator).

    python -m benchmarks.export --exchanges 30000

Every step is the CLI as a user runs it, in its own process; the machine's load moves the
seconds, so compare runs made side by side.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolproxy.testing.corpus import generate

_CLI = [sys.executable, "-c", "from toolproxy.cli import main; main()"]


def _timed(*args: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([*_CLI, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"`toolproxy {' '.join(args)}` failed:\n{proc.stderr}")
    return seconds, proc.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exchanges", type=int, default=30000)
    ap.add_argument("--new", type=int, default=1000, help="Exchanges of new traffic before the incremental export.")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="toolproxy-export-bench-") as tmp:
        data, out = Path(tmp) / "data", Path(tmp) / "out"
        generate(data, args.exchanges)
        _timed("analyze", "--data", str(data))
        rows = []
        rows.append(("first export", *_timed("export", "--data", str(data), "--out", str(out))))
        rows.append(("again, nothing new", *_timed("export", "--data", str(data), "--out", str(out))))
        # the same generator under another seed: new episodes in the same runs and day
        generate(Path(tmp) / "more", args.new, seed=11)
        for seg in (Path(tmp) / "more" / "segments").iterdir():
            seg.rename(data / "segments" / f"more-{seg.name}")
        _timed("analyze", "--data", str(data))
        rows.append((f"after {args.new} new exchanges", *_timed("export", "--data", str(data), "--out", str(out))))
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{args.exchanges} exchanges analysed; export is {size / 1e6:.1f} MB on disk")
    for name, seconds, last in rows:
        print(f"{name:>28}: {seconds:6.2f}s  ({last})")


if __name__ == "__main__":
    main()
