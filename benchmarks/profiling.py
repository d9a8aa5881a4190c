"""Where a proxy's CPU per request goes: py-spy samples of its processes under load, weighed by
each thread's own CPU time, attributed to named parts of the request's path.

py-spy (PyPI; not a toolproxy dependency) samples every thread's Python stack without stopping
the process (`--nonblocking`), from the load generator's core. A sample says what a thread was
doing, not that it had a CPU: a runnable thread waiting for the core (the classifier at
SCHED_IDLE, a loop preempted by its upstream) is sampled all the same. So samples only split
each thread's CPU seconds, read from /proc over the same stretch, between parts; a part's cost
is its share of its thread times that thread's CPU, divided by the requests answered.

A sample belongs to the innermost frame that names a part (`PARTS`): the proxy's own code by
module and function, aiohttp's server and client by module, the event loop last. Modules that
both sides use (aiohttp's writer, payloads, streams, helpers) name no part, so a socket write is
the server's or the client's by who made it. Threads other than the event loop's are parts of
their own (the writer thread's by what it does).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
from pathlib import Path

# (file suffix, function name or its start, or "" for any) -> part, matched innermost frame first.
PARTS: tuple[tuple[str, str, str], ...] = (
    ("toolproxy/proxy/tags.py", "", "request: path tags, query redaction"),
    ("toolproxy/proxy/headers.py", "Redactor.query", "request: path tags, query redaction"),
    ("toolproxy/wire/hopbyhop.py", "connection_listed", "headers: copied up and down"),
    ("toolproxy/proxy/forward.py", "_upstream_headers", "headers: copied up and down"),
    ("toolproxy/proxy/forward.py", "_relay.<locals>.<listcomp>", "headers: copied up and down"),
    ("toolproxy/proxy/headers.py", "", "headers: redacted for the record"),
    ("toolproxy/proxy/flow.py", "Flow.", "record: Flow and Record built (ids, clocks, body text)"),
    ("toolproxy/record/model.py", "new_id", "record: Flow and Record built (ids, clocks, body text)"),
    ("toolproxy/record/model.py", "now", "record: Flow and Record built (ids, clocks, body text)"),
    ("toolproxy/record/model.py", "encode_body", "record: Flow and Record built (ids, clocks, body text)"),
    ("<string>", "__create_fn__", "record: Flow and Record built (ids, clocks, body text)"),
    ("toolproxy/record/model.py", "encode_record", "record: serialised on the loop (orjson)"),
    ("toolproxy/record/writer.py", "", "record: handed to the writer (submit, backpressure)"),
    ("toolproxy/proxy/recorder.py", "", "recorder hook: body tee, record completed"),
    ("toolproxy/proxy/spool.py", "", "recorder hook: body tee, record completed"),
    ("toolproxy/proxy/flow.py", "", "other addons' hooks (counters, exposure, health, durability, ...)"),
    ("toolproxy/proxy/counters.py", "", "other addons' hooks (counters, exposure, health, durability, ...)"),
    ("toolproxy/proxy/exposure.py", "", "other addons' hooks (counters, exposure, health, durability, ...)"),
    ("toolproxy/proxy/upstreamhealth.py", "", "other addons' hooks (counters, exposure, health, durability, ...)"),
    ("toolproxy/proxy/durability.py", "", "other addons' hooks (counters, exposure, health, durability, ...)"),
    ("toolproxy/proxy/condition.py", "", "other addons' hooks (counters, exposure, health, durability, ...)"),
    ("toolproxy/proxy/stackwatch.py", "", "other addons' hooks (counters, exposure, health, durability, ...)"),
    ("toolproxy/proxy/watchdog.py", "", "other addons' hooks (counters, exposure, health, durability, ...)"),
    ("toolproxy/proxy/pool.py", "", "upstream connection pool and its trace hooks"),
    ("toolproxy/proxy/forward.py", "", "the handler (forward.py, bench.py)"),
    ("benchmarks/proxy.py", "", "the handler (forward.py, bench.py)"),
    ("toolproxy/proxy/listener.py", "", "aiohttp server: read, parse, request object"),
    ("aiohttp/web_app.py", "", "aiohttp Application and router"),
    ("aiohttp/web_urldispatcher.py", "", "aiohttp Application and router"),
    ("aiohttp/web_response.py", "", "aiohttp server: response headers and writes"),
    ("aiohttp/web_protocol.py", "", "aiohttp server: read, parse, request object"),
    ("aiohttp/web_request.py", "", "aiohttp server: read, parse, request object"),
    ("aiohttp/web_server.py", "", "aiohttp server: read, parse, request object"),
    ("aiohttp/http_parser.py", "", "aiohttp server: read, parse, request object"),
    ("aiohttp/client.py", "", "aiohttp client: request upstream, read its reply"),
    ("aiohttp/client_reqrep.py", "", "aiohttp client: request upstream, read its reply"),
    ("aiohttp/client_proto.py", "", "aiohttp client: request upstream, read its reply"),
    ("aiohttp/connector.py", "", "aiohttp client: request upstream, read its reply"),
    ("aiohttp/tracing.py", "", "aiohttp client: request upstream, read its reply"),
)
EVENT_LOOP = "event loop (uvloop or asyncio), tasks, timers"
THREAD_PARTS = {  # Python thread name -> part, for threads other than the event loop's
    "toolproxy-fsync": "writer: fsync thread",
    "toolproxy-liveview": "live page: feeder thread",
}
WRITER_THREAD = "toolproxy-writer"
WRITER_PARTS: tuple[tuple[str, str, str], ...] = (
    ("toolproxy/live/view.py", "", "live page: the writer's hand-over (observe)"),
    ("toolproxy/record/chunks.py", "", "writer: dedup packer"),
    ("toolproxy/record/model.py", "encode_record", "writer: serialising large records"),
    ("toolproxy/record/writer.py", "SegmentWriter._append", "writer: write(2) of each batch"),
    ("toolproxy/record/writer.py", "SegmentWriter._print_log", "writer: per-exchange log lines"),
)
WRITER_OTHER = "writer: its loop, wake-ups, counters"
CLASSIFIER = "live page: classifier process"
OTHER_PROCESS = "other processes of the tree (unsampled: a starved classifier, a resource tracker)"

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::\d+)?\)$")
_THREAD = re.compile(r"thread \((?P<tid>\d+)\)(?:: (?P<name>.*))?$")


def part_of(frames: list[str], rules=PARTS, default: str = EVENT_LOOP) -> str:
    """The part one sample belongs to: the first rule matching a frame, innermost frame first."""
    for frame in reversed(frames):
        m = _FRAME.match(frame)
        if m is None:
            continue
        func, file = m["func"], m["file"]
        for suffix, name, part in rules:
            if file.endswith(suffix) and func.startswith(name):
                return part
    return default


def read_samples(raw: str) -> dict[int, tuple[str, str, collections.Counter]]:
    """py-spy's raw (collapsed) output -> {thread id: (process line, thread name, Counter(part))}."""
    out: dict[int, tuple[str, str, collections.Counter]] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        # The process's command line may hold a ';' of its own: the thread part is the first that reads as one.
        at = next((i for i, part in enumerate(parts) if i and _THREAD.match(part)), None)
        if at is None:
            continue
        process, m, frames = ";".join(parts[:at]), _THREAD.match(parts[at]), parts[at + 1 :]
        tid, name = int(m["tid"]), m["name"] or ""
        if "spawn_main" in process or "toolproxy.live.classifier" in process:
            part = CLASSIFIER
        elif "resource_tracker" in process:
            part = OTHER_PROCESS
        elif name == WRITER_THREAD:
            part = part_of(frames, WRITER_PARTS, WRITER_OTHER)
        elif name in THREAD_PARTS:
            part = THREAD_PARTS[name]
        elif name == "MainThread":
            part = part_of(frames)
        else:
            part = f"thread {name}"
        out.setdefault(tid, (process, name, collections.Counter()))[2][part] += int(count)
    return out


def thread_cpu(pids: list[int]) -> dict[int, tuple[int, str, float]]:
    """{thread id: (process id, kernel thread name, CPU seconds so far)} for these processes."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(") ", 1)[1].split()
            out[int(tid)] = (
                pid,
                stat[stat.index("(") + 1 : stat.rindex(")")],
                (int(fields[11]) + int(fields[12])) / tick,
            )
    return out


def attribute(
    samples: dict[int, tuple[str, str, collections.Counter]],
    cpu: dict[int, tuple[int, str, float]],
    requests: int,
    main_pids: set[int],
) -> dict[str, float]:
    """{part: CPU microseconds per request}: each thread's CPU split by its samples' parts (pure).

    A thread of the proxy's own process that used CPU but was never sampled is a part of its own
    (a thread with no Python frames); one of another process in the tree counts as OTHER_PROCESS."""
    out: collections.Counter = collections.Counter()
    for tid, (pid, comm, seconds) in cpu.items():
        if seconds <= 0:
            continue
        us = seconds / max(requests, 1) * 1e6
        sampled = samples.get(tid)
        if sampled is None or not sum(sampled[2].values()):
            out[f"unsampled thread ({comm})" if pid in main_pids else OTHER_PROCESS] += us
            continue
        counts = sampled[2]
        total = sum(counts.values())
        for part, n in counts.items():
            out[part] += us * n / total
    return dict(out)


def record(py_spy: str, pid: int, seconds: float, out: Path, rate: int = 250) -> str:
    """py-spy's raw samples of `pid` and its children for `seconds` (blocking)."""
    subprocess.run(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--threads",
            "--nonblocking",
            "--rate",
            str(rate),
            "--duration",
            str(max(1, round(seconds))),
            "--format",
            "raw",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=seconds + 60,
        check=False,
    )
    return out.read_text() if out.exists() else ""


def breakdown_table(profiles: dict[str, dict[str, float]], floor: str) -> str:
    """A Markdown table: parts as rows, targets as columns (us/request), and each one minus the floor."""
    names = list(profiles)
    parts = sorted(
        {p for prof in profiles.values() for p in prof},
        key=lambda p: -max(prof.get(p, 0.0) for prof in profiles.values()),
    )
    others = [n for n in names if n != floor]
    head = (
        "| part (CPU us per request) | "
        + " | ".join(names)
        + " | "
        + " | ".join(f"{n} - {floor}" for n in others)
        + " |"
    )
    lines = [head, "|---" * (1 + len(names) + len(others)) + "|"]
    for part in parts:
        vals = [profiles[n].get(part, 0.0) for n in names]
        diffs = [profiles[n].get(part, 0.0) - profiles[floor].get(part, 0.0) for n in others]
        lines.append(
            f"| {part} | "
            + " | ".join(f"{v:.1f}" for v in vals)
            + " | "
            + " | ".join(f"{d:+.1f}" for d in diffs)
            + " |"
        )
    totals = [sum(profiles[n].values()) for n in names]
    lines.append(
        "| **total** | "
        + " | ".join(f"**{t:.1f}**" for t in totals)
        + " | "
        + " | ".join(f"**{sum(profiles[n].values()) - totals[names.index(floor)]:+.1f}**" for n in others)
        + " |"
    )
    return "\n".join(lines)
