"""What every `analyze` does after its checks: the new lines of every segment loaded (load/), then
the runs they added to derived again (episodes/), in that order and always both, so a store is
never left with loaded exchanges that no turn holds.

Loading commits as it goes (every few hundred MB, with the offsets it reached); the links to
stored Responses and the derive then run in one transaction of their own.
"""

from __future__ import annotations

import time
from pathlib import Path

from toolproxy.analysis.episodes.derive import derive_changes
from toolproxy.analysis.load.pipeline import Ingestor, Summary, link_stored_responses
from toolproxy.term.progress import Progress


def ingest(
    con,
    data_dir: str | Path,
    *,
    batch_bytes: int = 8 << 20,
    workers: int | None = None,
    progress: Progress | None = None,
) -> Summary:
    """Ingest every new line of every segment under data_dir, then re-derive the affected runs.

    workers: processes analysing batches in parallel; None picks by the amount of new data.
    progress: told the new bytes to read, then advanced by each batch written.
    """
    t0 = time.perf_counter()
    loader = Ingestor(con, data_dir, batch_bytes=batch_bytes, workers=workers, progress=progress)
    summary = loader.run()
    phase = None
    con.execute("BEGIN TRANSACTION")
    try:
        link_stored_responses(con, loader.affected_runs)
        phase = progress.then("analyze: turns and episodes", unit="runs") if progress is not None else None
        totals = derive_changes(con, loader.affected_runs, progress=phase, whole=loader.whole_runs, in_steps=True)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    finally:
        if phase is not None:
            phase.close()
    summary.turns, summary.episodes = totals["turns"], totals["episodes"]
    summary.runs_in_part, summary.episodes_in_part = totals["in_part"], totals["episodes_in_part"]
    summary.runs = totals["runs"]
    summary.seconds = time.perf_counter() - t0
    return summary
