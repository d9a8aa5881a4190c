"""Benchmark: what storing repeated body content once (record/chunks.py) saves and costs.

    python -m benchmarks.storage [--episodes 10] [--turns 50] [--rounds 5]

Agent episodes as harnesses send them: chat-completions requests with a tools array, the whole
history resent every turn, growing by `--growth` bytes a turn (an assistant tool call and a tool
result of varied text); the upstream answers with a non-streamed tool call. The records are the
proxy's own, written by the proxy's SegmentWriter with dedup on and off. Printed, side by side:

- storage: bytes on disk (segments, everything included) / raw request bytes, for one episode;
- writer throughput: records/s through SegmentWriter (submit to fsync'ed close), and the CPU
  time per record, for the episode records interleaved as concurrent agents send them; records/s
  for small records (bodies under the inline threshold, the common case);
- ingest rate: exchanges/s of `analyze`'s ingest over the same records.

Throughput and ingest run in interleaved rounds (on, off, on, off, ...) and report medians and
the on/off ratio, since the machine may be shared and noisy.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from toolproxy.analysis.lifecycle.ingest import ingest
from toolproxy.analysis.store.connection import connect
from toolproxy.record.model import Record
from toolproxy.record.segments import list_segments
from toolproxy.record.writer import SegmentWriter
from toolproxy.testing.corpus import episode, interleaved, small_records


def write(data_dir: Path, records: list[Record], dedup: bool) -> tuple[float, float]:
    """(wall, CPU) seconds from the first submit until every record is fsync'ed and the writer
    has stopped. CPU is the whole process's: the GIL time the proxy's event loop would compete with."""
    writer = SegmentWriter(data_dir, max_queue=len(records) + 1, dedup=dedup)
    writer.start()
    t0, c0 = time.perf_counter(), time.process_time()
    for rec in records:
        writer.submit(rec)
    writer.close(timeout=600)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if writer.stats.written != len(records):
        raise SystemExit(f"writer wrote {writer.stats.written} of {len(records)} records")
    return dt, cpu


def disk_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in list_segments(data_dir))


def ingest_seconds(data_dir: Path, expected: int) -> float:
    db = data_dir / "bench.duckdb"
    db.unlink(missing_ok=True)
    con = connect(db)
    try:
        summary = ingest(con, data_dir, workers=0)
    finally:
        con.close()
    if summary.new_exchanges != expected or summary.issues:
        raise SystemExit(f"ingest saw {summary.new_exchanges} of {expected} exchanges; issues: {summary.issues[:3]}")
    return summary.seconds


def _ratio(on: list[float], off: list[float]) -> str:
    return (
        f"on {statistics.median(on):>10,.0f}  off {statistics.median(off):>10,.0f}  on/off "
        f"{statistics.median(on) / statistics.median(off):.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=10, help="concurrent episodes for the throughput and ingest rounds")
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--growth", type=int, default=2048, help="bytes the history grows by each turn")
    ap.add_argument("--small", type=int, default=20000, help="small records per throughput round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    rnd = random.Random(11)
    episodes = [episode(rnd, n, args.turns, args.growth) for n in range(args.episodes)]
    many = interleaved(episodes)
    small = small_records(args.small)
    root = Path(tempfile.mkdtemp(prefix="toolproxy-storage-bench-"))
    try:
        one = episodes[0]
        raw_req = sum(r.request_body_size for r in one)
        raw_all = raw_req + sum(len(r.response_body.encode()) for r in one)
        print(
            f"one episode: {len(one)} turns, last request {one[-1].request_body_size:,} bytes, "
            f"raw request bytes {raw_req:,} (+ responses: {raw_all:,})"
        )
        for dedup in (True, False):
            d = root / f"one-{dedup}"
            write(d, one, dedup)
            size = disk_bytes(d)
            print(
                f"  dedup {'on ' if dedup else 'off'}: {size:>10,} bytes on disk; / raw request bytes = "
                f"{size / raw_req:.3f}; / raw request+response bytes = {size / raw_all:.3f}"
            )

        times: dict[str, list[float]] = {
            f"{k}-{tag}": [] for k in ("many", "many-cpu", "small", "ingest") for tag in ("on", "off")
        }
        for rnd_no in range(args.rounds):
            for dedup in (True, False) if rnd_no % 2 == 0 else (False, True):
                tag = "on" if dedup else "off"
                d = root / f"r{rnd_no}-{tag}"
                wall, cpu = write(d, many, dedup)
                times[f"many-{tag}"].append(len(many) / wall)
                times[f"many-cpu-{tag}"].append(cpu / len(many) * 1e6)
                times[f"ingest-{tag}"].append(len(many) / ingest_seconds(d, len(many)))
                s = root / f"r{rnd_no}-{tag}-small"
                times[f"small-{tag}"].append(len(small) / write(s, small, dedup)[0])
                shutil.rmtree(s)
        on_size, off_size = disk_bytes(root / "r0-on"), disk_bytes(root / "r0-off")
        print(
            f"{args.episodes} interleaved episodes ({len(many)} records): {on_size:,} bytes on disk with dedup, "
            f"{off_size:,} without ({on_size / off_size:.3f})"
        )
        print(f"medians of {args.rounds} interleaved rounds:")
        print(f"  writer, episode records/s   {_ratio(times['many-on'], times['many-off'])}")
        print(f"  writer, CPU us per record   {_ratio(times['many-cpu-on'], times['many-cpu-off'])}")
        print(f"  writer, small records/s     {_ratio(times['small-on'], times['small-off'])}")
        print(f"  ingest, exchanges/s         {_ratio(times['ingest-on'], times['ingest-off'])}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
