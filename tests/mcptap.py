"""A tap on a stdio pipe pair, for the MCP tests: `python tests/mcptap.py LOG -- CMD ARGS` runs
CMD, passes stdin to it and its stdout back unchanged, and appends each direction's bytes to
LOG.in and LOG.out as they pass. Put between a client and the wrapper, and between the wrapper
and the server, it shows what each side of the wrapper sent."""

from __future__ import annotations

import os
import subprocess
import sys
import threading


def pump(src: int, dst: int, log: str) -> None:
    with open(log, "ab", buffering=0) as f:
        while True:
            data = os.read(src, 65536)
            if not data:
                break
            f.write(data)
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view) :]


def main() -> int:
    log = sys.argv[1]
    argv = sys.argv[sys.argv.index("--") + 1 :]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    up = threading.Thread(target=lambda: (pump(0, proc.stdin.fileno(), log + ".in"), proc.stdin.close()), daemon=True)
    down = threading.Thread(target=pump, args=(proc.stdout.fileno(), 1, log + ".out"))
    up.start()
    down.start()
    code = proc.wait()
    down.join()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
