"""The stats of a group of workers (`serve --workers N`) as one: what each worker published
(read_peers) merged with the answering worker's own live numbers (group_snapshot, pure), for the
admin route of whichever worker the kernel hands the request to (`workers.Worker.merged`).

Counters are summed; numbers that describe a process (uptime, the sample rate) take the largest, gauges (in
flight, queue depth) come from live workers only; a crashed worker's last numbers (`retired-*`,
kept by the supervisor) still count, so counters never go backwards after a restart. A worker that
stopped gracefully published once more after its writer closed, marked `final`: its counts are
complete. One that was killed (or crashed) left its last periodic numbers, up to
`workers.PUBLISH_EVERY` old: whatever it did after them is in no count, so the group's totals are
partial from then on and the merged stats say so, naming the worker, with status `partial`
(health still answers 200: the group serves and records). A live worker whose numbers are older
than STALE_AFTER is reported as not answering, and the status is `degraded`.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import orjson

# A live worker whose snapshot is older than this is reported as not answering.
STALE_AFTER = 3.0
# Numbers that describe a process rather than count events: the largest, not the sum, is right.
NOT_SUMMED = {"uptime_s", "sample_rate"}
# Numbers that describe the present: a worker that is gone has none of them any more.
GAUGES = {"in_flight", "queue_depth"}


def merge_snapshots(live: list[dict], retired: list[dict] = ()) -> dict:
    """One snapshot for the whole group: counters summed, gauges from live workers only,
    status `ok` only when every live worker says so, the first value of anything else."""
    out: dict = {}
    for snap in live:
        _merge_into(out, snap)
    for snap in retired:
        _merge_into(out, _counters_only(snap))
    return out


def _counters_only(snap: dict) -> dict:
    out = {}
    for k, v in snap.items():
        if k in GAUGES or k in ("status", "last_error", "degraded"):
            continue
        out[k] = _counters_only(v) if isinstance(v, dict) else v
    return out


def _merge_into(out: dict, snap: dict) -> None:
    for key, value in snap.items():
        if key not in out or out[key] is None:
            out[key] = copy.deepcopy(value)
        elif value is not None:
            out[key] = _merge_value(key, out[key], value)


def _merge_value(key: str, a: Any, b: Any) -> Any:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) or bool(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return max(a, b) if key in NOT_SUMMED else a + b
    if isinstance(a, dict) and isinstance(b, dict):
        merged = dict(a)
        _merge_into(merged, b)
        return merged
    if isinstance(a, list) and isinstance(b, list):
        return a + [x for x in b if x not in a]
    if key == "status" and a == "ok":
        return b
    return a


def read_peers(peers_dir: Path) -> tuple[list[dict], list[dict], dict]:
    live, retired = [], []
    for p in peers_dir.glob("*.json"):
        try:
            data = orjson.loads(p.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue  # replaced or removed under us: the next read sees it
        if p.name.startswith("worker-"):
            live.append(data)
        elif p.name.startswith("retired-"):
            retired.append(data)
    try:
        supervisor = orjson.loads((peers_dir / "supervisor.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        supervisor = {}
    return live, retired, supervisor


def group_snapshot(
    own: dict, live: list[dict], retired: list[dict], supervisor: dict, now: float | None = None
) -> dict:
    """Merge the workers' snapshots and say which workers answer (pure, for tests and the handler).

    `own` is the answering worker's live snapshot, the others are what its peers last published;
    every snapshot carries a `worker` entry (index, pid, published_at).
    """
    now = time.time() if now is None else now
    own_pid = own["worker"]["pid"]
    alive_pids = set(supervisor.get("pids", ())) | {own_pid}
    peers = [
        s for s in live if s.get("worker", {}).get("pid") != own_pid and s.get("worker", {}).get("pid") in alive_pids
    ]
    snaps = [own, *peers]
    merged = merge_snapshots(snaps, retired)
    merged.pop("worker", None)
    per_worker, silent = [], []
    answered = {own_pid} | {s["worker"]["pid"] for s in peers}
    for s in peers:
        age = now - s["worker"]["published_at"]
        if age > STALE_AFTER:
            silent.append(f"worker {s['worker']['index']} (pid {s['worker']['pid']}) last reported {age:.0f}s ago")
    for pid in sorted(alive_pids - answered):
        silent.append(f"worker pid {pid} has not reported yet")
    count = supervisor.get("count", len(snaps))
    if len(alive_pids) < count:
        silent.append(
            f"{count - len(alive_pids)} of {count} workers not running (being restarted after: "
            f"{supervisor.get('last_exit')})"
        )
    restarts = {slot["index"]: slot.get("restarts", 0) for slot in supervisor.get("slots", ())}
    for s in snaps:
        w = s["worker"]
        per_worker.append(
            {
                "index": w["index"],
                "pid": w["pid"],
                "status": s.get("status"),
                "exchanges": s.get("exchanges"),
                "in_flight": s.get("in_flight"),
                "restarts": restarts.get(w["index"], 0),
            }
        )
    merged["workers"] = {
        "count": count,
        "answering": len(snaps) - sum(1 for s in peers if now - s["worker"]["published_at"] > STALE_AFTER),
        "restarts": supervisor.get("restarts", 0),
        "last_exit": supervisor.get("last_exit"),
        "per_worker": sorted(per_worker, key=lambda w: w["index"]),
    }
    down = [slot["index"] for slot in supervisor.get("slots", ()) if slot.get("pid") is None]
    if down:
        merged["workers"]["not_running"] = down
    missing = [_missing_counts(s["worker"]) for s in retired if not s.get("worker", {}).get("final")]
    if missing:
        merged["workers"]["counts_missing"] = missing
        if merged.get("status") == "ok":
            merged["status"] = "partial"
    if silent:
        merged["status"] = "degraded"
        merged["workers"]["problems"] = silent
    return merged


def _missing_counts(worker: dict) -> str:
    """Why the group's totals lack part of what a worker that did not stop gracefully did."""
    name = f"worker {worker.get('index')} (pid {worker.get('pid')})"
    exit_text, exited, published = worker.get("exit"), worker.get("exited_at"), worker.get("published_at")
    how = f"exited with {exit_text}" if exit_text else "stopped without a final report"
    since = (
        f", {exited - published:.2f}s after its last report"
        if isinstance(exited, (int, float)) and isinstance(published, (int, float))
        else ""
    )
    return (
        f"{name} {how}{since}: what it did after that report (exchanges, records written) is in no "
        "count, so these totals are partial"
    )
