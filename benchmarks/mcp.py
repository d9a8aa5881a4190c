"""What the stdio MCP wrapper adds to each message: a server behind `toolproxy mcp` beside the
same server on a direct pipe.

    python -m benchmarks.mcp [--messages 2000] [--rounds 5] [--json OUT]

The server is an echo of the smallest kind (it answers each JSON-RPC request line at once with a
~1 KB result of the same id), so what is measured is the relay, not a tool. The client sends one
request, waits for its answer, and times the round trip; each round trip is two messages (the
request up, the answer down), so the wrapper's cost per message is half the difference of the
medians. Targets are measured in interleaved rounds and reported as medians with the load
average: the machine is shared, so the numbers are indicative, the ratio within one run more so.
The wrapped runs record as in use (a data directory of their own, every exchange written); the
benchmark checks that every round trip was recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ECHO = r"""
import sys
out = sys.stdout.buffer
result = b',"result":{"content":[{"type":"text","text":"' + b"x" * 1000 + b'"}],"isError":false}}\n'
for line in sys.stdin.buffer:
    i = line.index(b'"id":') + 5
    rid = line[i:line.index(b",", i)]
    out.write(b'{"jsonrpc":"2.0","id":' + rid + result)
    out.flush()
"""


def request(i: int) -> bytes:
    args = {"path": "/tmp/project/src/main.py", "offset": i, "limit": 200}
    doc = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "read_file", "arguments": args}}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def round_trips(argv: list[str], n: int) -> list[float]:
    """Seconds per request/answer round trip, `n` of them, over a fresh server process."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    out = []
    try:
        for i in range(50):  # warm up: imports, the first writes
            proc.stdin.write(request(i))
            proc.stdout.readline()
        for i in range(50, 50 + n):
            line = request(i)
            t = time.perf_counter()
            proc.stdin.write(line)
            answer = proc.stdout.readline()
            out.append(time.perf_counter() - t)
            if not answer:
                raise RuntimeError(f"{argv[0]} stopped answering")
    finally:
        proc.stdin.close()
        proc.wait(30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000, help="round trips per round and target")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        echo = Path(tmp) / "echo.py"
        echo.write_text(ECHO)
        server = [sys.executable, str(echo)]
        data = Path(tmp) / "data"
        wrapped = [sys.executable, "-m", "toolproxy.cli", "mcp", "--data", str(data), "--name", "echo", "--", *server]
        medians: dict[str, list[float]] = {"direct": [], "toolproxy": []}
        load = os.getloadavg()
        for _ in range(args.rounds):
            for name, argv in (("direct", server), ("toolproxy", wrapped)):
                medians[name].append(statistics.median(round_trips(argv, args.messages)) * 1e3)
        load = [round((a + b) / 2, 2) for a, b in zip(load, os.getloadavg())]
        from toolproxy.record.segments import read_records

        recorded = sum(1 for r in read_records(data) if r.get("mcp", {}).get("method") == "tools/call")
    direct, wrapped_ms = statistics.median(medians["direct"]), statistics.median(medians["toolproxy"])
    result = {
        "messages_per_round": args.messages,
        "rounds": args.rounds,
        "round_trip_median_ms": {"direct": round(direct, 4), "toolproxy": round(wrapped_ms, 4)},
        "per_round_ms": {k: [round(v, 4) for v in vs] for k, vs in medians.items()},
        "added_per_message_ms": round((wrapped_ms - direct) / 2, 4),
        "recorded": recorded,
        "expected_records": (args.messages + 50) * args.rounds,
        "loadavg": load,
    }
    print("| target | median round trip (ms) |\n|---|---|")
    print(f"| direct pipe | {direct:.3f} |\n| toolproxy mcp | {wrapped_ms:.3f} |")
    print(
        f"added per message (half a round trip's difference): {result['added_per_message_ms']:.3f} ms; "
        f"recorded {recorded} of {result['expected_records']} calls; load average {load}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
