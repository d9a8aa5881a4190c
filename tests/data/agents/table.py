"""The truth table of the coding-agent captures: what `toolproxy analyze` concludes from each
capture's segments, next to the agent's own record of it (records.py).

    python tests/data/agents/table.py [CASE_DIR ...]     (default: every folder under emulated/)

Per capture: episodes (tasks and, in brackets, subagent episodes where the analyzer links them),
side requests, turns due a call, delivered calls (those that are not a harness's finishing call),
tasks answered, and the exchanges that are neither attempts nor side requests with a 4xx status; then
the agent's own tasks (+ subagents), tool uses it executed, and tasks it answered.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from records import own  # noqa: E402


def _columns(con, table: str) -> set[str]:
    return {
        r[0]
        for r in con.execute(
            f"SELECT column_name FROM information_schema.columns WHERE table_name = '{table}'"
        ).fetchall()
    }


def analysed(case: Path) -> dict:
    from toolproxy.analysis.store.connection import connect

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(case / "segments", data / "segments")
        r = subprocess.run(
            [sys.executable, "-m", "toolproxy.cli", "analyze", "--data", str(data)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if r.returncode:
            raise SystemExit(r.stderr)
        con = connect(data / "toolproxy.duckdb", read_only=True)
        try:
            one = lambda sql: con.execute(sql).fetchone()[0]  # noqa: E731
            turns = _columns(con, "turns")
            episodes = _columns(con, "episodes")
            exchanges = _columns(con, "exchanges")
            side = (
                one("SELECT count(*) FROM exchanges WHERE side_request IS NOT NULL")
                if "side_request" in exchanges
                else 0
            )
            child = "parent_episode" in episodes
            row = {
                "episodes": one("SELECT count(*) FROM episodes" + (" WHERE parent_episode IS NULL" if child else "")),
                "linked": dict(
                    con.execute("SELECT link, count(*) FROM episodes WHERE link IS NOT NULL GROUP BY 1").fetchall()
                )
                if child
                else {},
                "side_requests": side,
                "call_turns": one("SELECT count(*) FROM turns WHERE role = 'call'"),
                "delivered": one(
                    "SELECT count(*) FROM turns WHERE delivered AND NOT coalesce(finishes, false)"
                    if "finishes" in turns
                    else "SELECT count(*) FROM turns WHERE delivered"
                ),
                "answers": one(
                    "SELECT count(DISTINCT coalesce(e.task_key, t.episode_key)) FROM turns t JOIN episodes e "
                    "USING (episode_key) WHERE t.role = 'answer' AND coalesce(e.link, '') <> 'subagent'"
                )
                if child
                else one("SELECT count(DISTINCT episode_key) FROM turns WHERE role = 'answer'"),
                "other_4xx": one(
                    "SELECT count(*) FROM exchanges WHERE NOT is_attempt AND status >= 400"
                    + (" AND side_request IS NULL" if "side_request" in exchanges else "")
                ),
            }
        finally:
            con.close()
    return row


def main() -> None:
    cases = [Path(a) for a in sys.argv[1:]] or sorted(p for p in (HERE / "emulated").iterdir() if p.is_dir())
    print(
        "| capture | tasks (+ linked episodes) | side requests | call turns | delivered | answered | other 4xx "
        "| agent: tasks (+subagents) | agent: tool uses run | agent: tasks answered |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        a, o = analysed(case), own(case)
        eps = f"{a['episodes']}" + "".join(f" (+{n} {link})" for link, n in sorted(a["linked"].items()))
        print(
            f"| {case.name} | {eps} | {a['side_requests']} | {a['call_turns']} | {a['delivered']} | {a['answers']} "
            f"| {a['other_4xx']} | {o['tasks']} (+{len(o['subagents'])}) | {len(o['tool_uses'])} "
            f"| {min(len(o['answers']), o['tasks'])} |"
        )


if __name__ == "__main__":
    main()
