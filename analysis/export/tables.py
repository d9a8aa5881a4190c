"""The analysis tables an export carries, and how each one's rows are keyed and partitioned.

Each table is exported with every column the database has (the tables are a public interface
whose columns are only ever added), so a later schema step reaches the export without a change
here; exchanges also carry their recorded bodies, read from the segments. A row's partition is its day (UTC) and
run: the day an exchange started, the day a call's
exchange or a turn's first attempt started, the day an episode's first turn did. A run is one
row, partitioned by run alone: any day it carried would move as the run grows.

A turn's or an episode's day can move after it was exported: `prune` deleting its earliest
exchanges, or earlier ones arriving late from another replica, and the row is re-derived under
another day. Those tables are marked `moves`, so an export looks for stale copies of their rows
in the partitions the database no longer has (analysis.export.parquet).
"""

from __future__ import annotations

from dataclasses import dataclass

# The recorded bodies stay in the segments; an exported exchange carries them (read through
# store.bodies_in_sql, which parquet.export sets up). They never change for an id, so
# they are not part of the row fingerprint that decides what to write again.
_WITH_BODIES = "t.*, unnest(bodies(t.segment, t.segment_offset))"

# An exchange's size as written, for batching: its record's line in the segment (the next record's
# offset, or for a segment's last one where ingest stopped reading). It bounds the bodies it carries.
_RECORD_BYTES = """SELECT e.rowid AS rid,
       coalesce(lead(e.segment_offset) OVER (PARTITION BY e.segment ORDER BY e.segment_offset),
                s.byte_offset, e.segment_offset) - e.segment_offset AS w
FROM exchanges e LEFT JOIN ingest_state s USING (segment)"""

_EXCHANGE_DAY = "coalesce({0}started_at, {0}ended_at, TIMESTAMP '1970-01-01')::DATE"


@dataclass(frozen=True)
class ExportTable:
    name: str
    # SQL over the table (aliased t) giving the row's key, day (a DATE, or None) and run.
    key: str
    day: str | None
    run: str
    # Extra FROM clause joined to t to compute `day`.
    joins: str = ""
    # The row as exported (aliased t).
    select: str = "t.*"
    # SQL for the day `--since` compares with, when it is not `day`.
    recent: str | None = None
    # A row's day can change once exported (see the module docstring).
    moves: bool = False
    # SQL giving (rid, w): each row's rowid and its size in bytes, for a table whose rows are large
    # (they carry bodies): its rows are then written in files of bounded size, not a partition at once.
    weight: str | None = None

    @property
    def since_day(self) -> str:
        return self.recent or self.day or "NULL::DATE"


TABLES: tuple[ExportTable, ...] = (
    ExportTable(
        "exchanges", key="t.id", day=_EXCHANGE_DAY.format("t."), run="t.run", select=_WITH_BODIES, weight=_RECORD_BYTES
    ),
    ExportTable(
        "calls",
        key="t.exchange_id || ':' || CAST(t.idx AS VARCHAR)",
        day="coalesce(x.day, DATE '1970-01-01')",
        run="coalesce(x.run, '')",
        joins=f"LEFT JOIN (SELECT id, run, {_EXCHANGE_DAY.format('')} AS day FROM exchanges) x ON x.id = t.exchange_id",
    ),
    ExportTable(
        "turns",
        key="t.turn_id",
        day="coalesce(x.day, DATE '1970-01-01')",
        run="t.run",
        joins=f"LEFT JOIN (SELECT turn_id, min({_EXCHANGE_DAY.format('')}) AS day FROM exchanges WHERE turn_id IS NOT "
        "NULL "
        "GROUP BY turn_id) x ON x.turn_id = t.turn_id",
        moves=True,
    ),
    ExportTable(
        "episodes",
        key="t.episode_key",
        day="coalesce(x.day, DATE '1970-01-01')",
        run="t.run",
        joins=f"LEFT JOIN (SELECT u.episode_key, min({_EXCHANGE_DAY.format('e.')}) AS day FROM turns u JOIN exchanges "
        "e "
        "ON e.turn_id = u.turn_id GROUP BY u.episode_key) x ON x.episode_key = t.episode_key",
        moves=True,
    ),
    ExportTable("runs", key="t.run", day=None, run="t.run", recent="t.last_seen::DATE"),
    # MCP traffic with its record's bodies (each request's and response's bytes as sent; over HTTP, the
    # exchange's, shared by the rows of its messages), sized by the record's line as exchanges are.
    ExportTable(
        "mcp_exchanges",
        key="t.id",
        day=_EXCHANGE_DAY.format("t."),
        run="coalesce(t.run, '')",
        select=_WITH_BODIES,
        weight=_RECORD_BYTES.replace("exchanges e", "mcp_exchanges e"),
    ),
)


def columns(con, table: str) -> list[str]:
    """The table's columns in the database's order."""
    return [
        r[0]
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = current_database() "
            "AND table_schema = current_schema() AND table_name = ? "
            "ORDER BY ordinal_position",
            [table],
        ).fetchall()
    ]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
