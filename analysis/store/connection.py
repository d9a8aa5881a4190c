"""The DuckDB file: opening it with errors a user can act on, bringing its schema up to date, and
giving SQL the recorded bodies (which stay in the segments)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np
import orjson

from toolproxy.analysis.store.columns import Columns
from toolproxy.analysis.store.memory import DEFAULT_MEMORY_LIMIT, MemoryLimitError, parse_memory_limit
from toolproxy.analysis.store.migrations import MIGRATIONS
from toolproxy.record.segments import BODIES_AS_RECORDED, RecordError, RecordReader

DB_NAME = "toolproxy.duckdb"


class StoreError(Exception):
    """A problem with the database file that the user must fix; the CLI prints it and exits 2."""


def default_db(data_dir: str | Path) -> Path:
    return Path(data_dir) / DB_NAME


def connect(
    db_path: str | Path,
    *,
    read_only: bool = False,
    create: bool = True,
    memory_limit: str | None = DEFAULT_MEMORY_LIMIT,
) -> duckdb.DuckDBPyConnection:
    """Open the database, migrated to the newest schema unless read_only.

    DuckDB allows one writing process per file; a second `analyze` (or a DuckDB shell holding the
    file open) gets a StoreError naming the file, not a lock traceback.
    """
    path = Path(db_path)
    if not path.exists() and (read_only or not create):
        if not path.parent.exists():
            raise StoreError(
                f"no data directory at {path.parent}: nothing was recorded there (serve, run and study record "
                "into --data DIR, ./toolproxy-data by default)"
            )
        raise StoreError(f"no database at {path}: run `toolproxy analyze` first (or pass --db)")
    if path.is_dir():
        raise StoreError(f"--db {path} is a directory; give the database file, e.g. {path / DB_NAME}")
    if not path.parent.is_dir():
        raise StoreError(f"cannot create {path}: directory {path.parent} does not exist")
    try:
        con = duckdb.connect(str(path), read_only=True) if read_only else _open_writer(path)
    except duckdb.IOException as exc:
        msg = str(exc)
        if "lock" in msg.lower():
            raise StoreError(
                f"{path} is in use by another process (DuckDB allows one writer); close it and retry. "
                f"({msg.splitlines()[0]})"
            ) from None
        raise StoreError(f"cannot open {path}: {msg.splitlines()[0]}") from None
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {path} as a DuckDB database: {str(exc).splitlines()[0]}") from None
    if memory_limit:
        try:
            limit = parse_memory_limit(memory_limit)
        except MemoryLimitError as exc:
            con.close()
            raise StoreError(f"memory limit {exc}") from None
        # DuckDB would otherwise take up to 80% of RAM as cache; past the limit it spills, to a
        # directory beside the database (a writer is an in-memory catalog with the file attached,
        # whose default would be `.tmp` in whatever directory the command was started from).
        con.execute(f"SET memory_limit='{limit}B'")
        con.execute(f"SET temp_directory='{_sql_literal(str(path.absolute()) + '.tmp')}'")
    if not read_only:
        # Bodies are most of the data and highly repetitive (every turn resends the conversation so
        # far). zstd stores them in a fraction of the space, and forcing it skips DuckDB's
        # per-checkpoint trial of every string codec, which costs ~5x the whole insert. Checkpointing
        # once per GB of WAL instead of per 16 MB keeps batches from recompressing each other.
        con.execute("PRAGMA force_compression='zstd'")
        con.execute("SET checkpoint_threshold='1GB'")
        migrate(con)
    else:
        have = schema_version(con)
        if have < MIGRATIONS[-1][0]:
            con.close()
            raise StoreError(
                f"{path} has schema version {have}; run `toolproxy analyze` to migrate it to {MIGRATIONS[-1][0]}"
            )
    return con


# Rows per row group of the writer. DuckDB writes a transaction's appends straight to the file,
# compressed, once they fill a row group ("optimistic writes"); with the default 122,880 rows
# (~800 MB of bodies here) an ingest never fills one, so every row went through the WAL at commit
# and was compressed again at checkpoint. At 8,192 rows an ingest batch or two fills one: ~35% less
# CPU per inserted row and a smaller transaction-local buffer.
WRITER_ROW_GROUP_SIZE = 8192


_WRITERS: dict[Path, duckdb.DuckDBPyConnection] = {}


def _open_writer(path: Path) -> duckdb.DuckDBPyConnection:
    """The database attached with WRITER_ROW_GROUP_SIZE (an ATTACH option only) as the default catalog.

    A process may attach a file only once, so a second writer in the same process (a library
    user, a test) gets a cursor on the first one: the sharing duckdb.connect(path) does itself.
    """
    key = path.resolve()
    base = _WRITERS.get(key)
    if base is not None:
        try:
            cur = base.cursor()
            cur.execute("USE toolproxy")
            return cur
        except duckdb.Error:  # closed since
            del _WRITERS[key]
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{_sql_literal(str(path))}' AS toolproxy (ROW_GROUP_SIZE {WRITER_ROW_GROUP_SIZE})")
        con.execute("USE toolproxy")
    except Exception:
        con.close()
        raise
    _WRITERS[key] = con
    return con


def _sql_literal(text: str) -> str:
    return text.replace("'", "''")


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version' AND table_schema = 'main'"
    ).fetchall()[0][0]
    if not exists:
        return 0
    return con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchall()[0][0]


def migrate(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Run every step newer than the database, each in its own transaction; return what ran."""
    con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER, applied_at TIMESTAMP)")
    have = schema_version(con)
    ran = []
    for version, _description, sql in MIGRATIONS:
        if version <= have:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [version])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        ran.append(version)
    return ran


def insert_columns(
    con: duckdb.DuckDBPyConnection,
    table: str,
    columns: dict[str, list],
    types: dict[str, str],
    *,
    on_conflict: str = "",
    fitted: bool = False,
) -> int:
    """Bulk-insert column lists in one statement; returns the row count.

    DuckDB scans a dict of NumPy object arrays in place, which is ~2x faster than writing JSON
    lines for read_json and needs neither pandas nor pyarrow. Values are plain Python; `types`
    gives each column's SQL type, with two conveniences: "JSON" columns take JSON text and
    "TIMESTAMP" columns take Unix epoch seconds (as records store them).

    A value that does not fit its column is stored as its JSON text (text columns) or NULL: a
    failed CAST would abort the caller's whole transaction. Values read out of bodies are like
    that; a caller that must refuse misfits instead checks first (ingest sets aside a record whose
    own fields do not fit). `fitted`: the caller made them fit already (Columns.fit).
    """
    if not fitted:
        columns = Columns(types).fit(columns)
    names = list(columns)
    n = len(columns[names[0]]) if names else 0
    if n == 0:
        return 0
    arrays = {}
    for name in names:
        arr = np.empty(n, dtype=object)
        values = columns[name]
        if types[name].endswith("[]"):
            for i, v in enumerate(values):  # slice assignment would broadcast equal-length lists
                arr[i] = v
        else:
            arr[:] = values
        arrays[name] = arr
    view = f"_batch_{table}"
    exprs = []
    for name in names:
        t = types[name]
        if t == "TIMESTAMP":
            exprs.append(f"make_timestamp(CAST(CAST({name} AS DOUBLE) * 1000000 AS BIGINT))")
        else:
            exprs.append(f"CAST({name} AS {t})")
    con.register(view, arrays)
    # Not in a `finally`: after a failed INSERT the transaction is aborted, unregistering fails
    # too, and that second error would hide the one that says what went wrong.
    con.execute(f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(exprs)} FROM {view} {on_conflict}")
    con.unregister(view)
    return n


def _text_or_json(value):
    return value if value is None or isinstance(value, str) else orjson.dumps(value, default=str).decode()


class BodiesAccess:
    """What bodies_in_sql yields: `failure` is why a body could not be read, once one could not, so
    a caller can tell that from any other failure of its query without matching message text."""

    failure: str | None = None


@contextmanager
def bodies_in_sql(con: duckdb.DuckDBPyConnection, data_dir: str | Path) -> Iterator[BodiesAccess]:
    """While inside, `bodies(segment, segment_offset)` is callable in SQL on `con`: the exchange's
    recorded bodies as the proxy wrote them (each one's text and encoding: BODIES_AS_RECORDED),
    read from its segment under data_dir, e.g.
    `SELECT id, bodies(segment, segment_offset).response_body FROM exchanges`.

    Copying every body into the database cost more than the rest of an ingest's writes together;
    reading one back is a positioned read. A record that cannot be read (its segment moved away)
    fails the query with the reason rather than reading as NULL. On leaving, the function is
    removed again (DuckDB refuses a second one of the same name) and the segments are closed.
    """
    reader = RecordReader(data_dir)
    access = BodiesAccess()

    def bodies(segment: str | None, offset: int | None) -> dict | None:
        if segment is None or offset is None:
            return None
        try:
            rec = reader.record(segment, offset)
        except RecordError as exc:
            access.failure = f"cannot read the bodies of an exchange: {exc}"
            raise StoreError(access.failure) from None
        # a field of another JSON type is not a body the ingest stored; shown as its JSON text
        return {name: _text_or_json(rec.get(name)) for name in BODIES_AS_RECORDED}

    text = duckdb.type("VARCHAR")
    struct = duckdb.struct_type({name: text for name in BODIES_AS_RECORDED})
    _retire_unfinished(con)
    con.create_function(
        "bodies", bodies, [text, duckdb.type("BIGINT")], struct, null_handling="special", side_effects=False
    )
    try:
        yield access
    finally:
        try:
            _retire_unfinished(con)
            con.remove_function("bodies")
        except duckdb.Error:  # the connection was closed inside
            pass
        reader.close()


def _retire_unfinished(con: duckdb.DuckDBPyConnection) -> None:
    """DuckDB refuses to add or remove a function while a result is left unfinished on the
    connection (a query interrupted mid-way, e.g. by Ctrl-C); a new statement retires it, as any
    next query would."""
    con.execute("SELECT 1").fetchall()
