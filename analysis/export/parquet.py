"""`toolproxy export --format parquet`: the analysis tables as hive-partitioned Parquet files.

The destination keeps its own state, a manifest (`_toolproxy_export/manifest.json`) listing every
partition's files with the row count and a fingerprint of the rows each holds, so an export is
incremental and idempotent wherever it runs: a second machine exporting the same analysis to the
same bucket reads the manifest and writes nothing it already finds there.

For each partition (table, day, run) of the database:
- not in the manifest: every row is written;
- the same row count and fingerprint as the manifest: nothing is written;
- otherwise the partition's exported keys (small key files under `_toolproxy_export/keys/`) are
  compared with the database: when every exported row is still there unchanged, only the new rows
  are written, as a new file beside the old ones; when any exported row changed or went (a
  re-analysis under a new analyzer version, `analyze --reclassify`, turns re-derived as a run
  grew), the partition is rewritten as one new file set that replaces the old.
Partitions the database no longer has (pruned) are kept in the export, as history, except for
rows the database still has under another day: a turn or episode whose earliest exchanges were
pruned (or whose earlier ones arrived late) is re-derived under a new day and exported there, so
its old copy is cut out of the history partition's files (a file left empty is deleted). A row's
key is never in the export twice. Only the history partitions of runs this export writes are
read, since a row that moved is always written to its new partition.

Exchanges carry their bodies, so a partition of them can hold gigabytes (long episodes resend
their whole history every turn): they are written as several files of a bounded size, derived from
the connection's memory limit, where the other tables write one file per partition.

With `layout="pieces"` (analysis.export.pieces) an exchange's bodies are written as lists of
piece hashes (`request_pieces`, `response_pieces`, `client_pieces`) and each piece's text once per destination, in
`pieces/part-*.parquet` (columns hash, text): a long episode then costs the size of its
conversation, not that size once per turn. The manifest lists the pieces files, each with a key
file of its hashes (`_toolproxy_export/keys/pieces/`), which is all a later export reads to know
the pieces the destination holds, and says the layout; an export refuses a destination written in
the other one. Pieces are never deleted: every exchange ever exported there, history included, may
point at them.

A crash never leaves a half-written state the next export trusts: data files are written first
under new names, then the manifest is replaced in one step, then the files it no longer lists are
deleted. A journal (`_toolproxy_export/pending.json`) written before the first file names what
the export adds and removes, so the next run finishes or undoes it; while it is fresh it also
keeps a second exporter off the same destination.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

from toolproxy.analysis.export.destination import Destination, ExportError
from toolproxy.analysis.export.partitions import partition_path
from toolproxy.analysis.export.pieces import split
from toolproxy.analysis.export.tables import TABLES, ExportTable, columns, quote_ident
from toolproxy.analysis.store.connection import bodies_in_sql
from toolproxy.analysis.store.memory import memory_limit_of
from toolproxy.record.chunks import BODY_FIELDS

# Bumped when the layout, the manifest or the meaning of a column in the files changes, for the
# layout it changes: a toolproxy refuses a destination of a newer format than it reads, so a layout
# that did not change keeps its number and older toolproxies keep exporting there.
# 1: the whole layout. Its files and manifest are still what format 1 wrote: the manifest's
#    "layout" is new, but format 1 ignores it, and no "layout" means whole.
# 2: `--layout pieces`: the manifest says its layout and lists pieces files, with their key files.
#    Key files needed no new number: a format-2 toolproxy from before them keeps them listed and
#    adds pieces files without one, which the next export here reads once (see _PieceWriter).
FORMAT_VERSIONS = {"whole": 1, "pieces": 2}
FORMAT_VERSION = max(FORMAT_VERSIONS.values())  # the newest format this toolproxy reads
PIECES_DIR = "pieces"
STATE_DIR = "_toolproxy_export"
MANIFEST = f"{STATE_DIR}/manifest.json"
PENDING = f"{STATE_DIR}/pending.json"
KEYS_DIR = f"{STATE_DIR}/keys"
# A journal older than this is from an export that died; a younger one is an export still running.
STALE_SECONDS = 3600.0
# Where a staging folder is: beside the export's state on a local destination, else in the temporary directory.
STAGING = "staging-"
TEMP_STAGING = "toolproxy-export-"
STAGING_LOCK = "owner.lock"
# Files handed to the destination at once: object stores upload a batch concurrently, and the
# progress line moves between batches.
_UPLOAD_BATCH = 32
# Key files of pieces files an export reads before it writes them as one (see _PieceWriter).
_MERGE_KEY_FILES = 32


@dataclass
class TableResult:
    name: str
    new: int = 0
    appended: int = 0
    rewritten: int = 0
    unchanged: int = 0
    rows: int = 0
    files: int = 0
    stale: int = 0  # old copies of moved rows cut out of history partitions


@dataclass
class ExportResult:
    tables: list[TableResult] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    export_id: str | None = None
    recovered: str | None = None
    pieces: int = 0  # new pieces written (--layout pieces)
    pieces_files: int = 0
    pieces_indexed: int = 0  # pieces files without a usable key file, read and given one


@dataclass
class _Staged:
    """What one table's planning and staging produced, not yet visible at the destination."""

    uploads: list[tuple[str, str]] = field(default_factory=list)  # (local file, destination path)
    obsolete: list[str] = field(default_factory=list)
    partitions: dict[str, dict] = field(default_factory=dict)  # partition path -> new manifest entry
    dropped: list[str] = field(default_factory=list)  # partitions no longer in the manifest (every row moved)


def versions(con, layout: str) -> dict[str, int]:
    """What the files were made from; stored in every file's key-value metadata and the manifest."""
    from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION
    from toolproxy.analysis.store.connection import schema_version
    from toolproxy.analysis.store.state import stored_version

    built = stored_version(con)
    if built != ANALYZER_VERSION:
        raise ExportError(
            f"the database was analysed under analyzer version {built if built is not None else 'unknown'}, "
            f"this toolproxy is version {ANALYZER_VERSION}: run `toolproxy analyze` first so the export "
            "does not carry outdated classifications"
        )
    return {
        "schema_version": schema_version(con),
        "analyzer_version": ANALYZER_VERSION,
        "export_format_version": FORMAT_VERSIONS[layout],
    }


def _key_file(table: str, rel_in_table: str) -> str:
    """Where a data file's keys are kept: outside the table's folder, and not named *.parquet, so
    no reader's glob picks them up as data."""
    return f"{KEYS_DIR}/{table}/{rel_in_table}.keys"


def _load_json(dest: Destination, rel: str) -> dict | None:
    data = dest.read_bytes(rel)
    if data is None:
        return None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ExportError(
            f"{dest.url}/{rel} is not valid JSON; it is toolproxy's export state, so this destination "
            "was changed by something else (move it away to start the export afresh)"
        ) from None
    if not isinstance(value, dict):
        raise ExportError(f"{dest.url}/{rel} is not an export state object; move it away to start afresh")
    return value


def _process_gone(host: str, pid: Any) -> bool:
    if host != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def recover(dest: Destination, manifest: dict | None, *, now: float) -> str | None:
    """Finish or undo an export that stopped between its first file and its last deletion.

    Returns a sentence saying what was done, or None when there was nothing to recover. Raises
    ExportError while another export's journal is fresh and its process may be alive.
    """
    journal = _load_json(dest, PENDING)
    if journal is None:
        return None
    started = journal.get("started_at", 0)
    if not _process_gone(journal.get("host"), journal.get("pid")) and now - float(started or 0) < STALE_SECONDS:
        when = dt.datetime.fromtimestamp(float(started or 0), dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        raise ExportError(
            f"another export to {dest.url} is in progress (host {journal.get('host')}, pid {journal.get('pid')}, "
            f"since {when}); run one export per destination at a time. If it died, its journal "
            f"{PENDING} is taken over {STALE_SECONDS / 60:.0f} minutes after it started, or delete it now"
        )
    committed = manifest is not None and manifest.get("export_id") == journal.get("export_id")
    gone = journal.get("obsolete", []) if committed else journal.get("new", [])
    dest.delete([p for p in gone if isinstance(p, str)])
    dest.delete([PENDING])
    verb = "finished" if committed else "undid"
    return f"{verb} the interrupted export {journal.get('export_id')} ({len(gone)} files removed)"


def _remove_stale_staging(parent: str, prefix: str, *, now: float, by_age: bool) -> None:
    """Delete the staging folders (`prefix`...) under `parent` that a killed export left behind.

    They hold the bodies the export was writing. A live export holds the lock on its folder's
    STAGING_LOCK for as long as it runs and the kernel lets go of it when the process dies, so a
    folder whose lock can be taken is a dead export's, whatever its age. With `by_age`, one
    without a lock file (from a toolproxy before it had one) goes once it is an hour old, as before.
    """
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        path = os.path.join(parent, entry)
        if not entry.startswith(prefix) or not os.path.isdir(path) or os.path.islink(path):
            continue
        try:
            fd = os.open(os.path.join(path, STAGING_LOCK), os.O_RDWR)
        except FileNotFoundError:
            if by_age and now - os.path.getmtime(path) > STALE_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
            continue
        except OSError:  # another user's folder in a shared temporary directory: not ours to judge
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # its export is alive
        finally:
            os.close(fd)


@contextlib.contextmanager
def _staging(parent: str, prefix: str, export_id: str):
    """A staging folder `prefix`+`export_id` under `parent`, locked while the export runs (see
    _remove_stale_staging), removed at its end. Made and locked under another name first, so that
    no other export ever sees it unlocked."""
    os.makedirs(parent, exist_ok=True)
    making = os.path.join(parent, f".{prefix}{export_id}")
    os.makedirs(making, mode=0o700)
    fd = os.open(os.path.join(making, STAGING_LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    path = os.path.join(parent, prefix + export_id)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(making, path)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(making, ignore_errors=True)
        os.close(fd)


@dataclass
class _Plan:
    """Each partition of one table that needs writing, by its number in _rows: "all" its rows, or
    only the "new" ones beside its intact files."""

    modes: dict[int, str] = field(default_factory=dict)
    paths: dict[int, str] = field(default_factory=dict)
    totals: dict[int, tuple[int, int]] = field(default_factory=dict)


def _row_fingerprints(con, table: ExportTable, runs: list[str] | None, since: dt.date | None) -> None:
    """_rows: every row of the table in scope, with its key, partition, fingerprint and rowid."""
    fingerprint = ", ".join(f"{quote_ident(c)} := t.{quote_ident(c)}" for c in columns(con, table.name))
    where, params = [], []
    if runs:
        where.append(f"{table.run} IN (SELECT unnest(?::VARCHAR[]))")
        params.append(runs)
    if since is not None:
        where.append(f"{table.since_day} >= ?")
        params.append(since)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE _rows AS SELECT k, d, r, h, rid, dense_rank() OVER (ORDER BY d, r) AS pid FROM ("
        f"SELECT {table.key} AS k, {table.day or 'NULL::DATE'} AS d, {table.run} AS r, t.rowid AS rid, "
        f"md5_number_lower(to_json(struct_pack({fingerprint}))::VARCHAR)::HUGEINT AS h "
        f"FROM {table.name} t {table.joins} {'WHERE ' + ' AND '.join(where) if where else ''})",
        params,
    )


def _plan(con, table: ExportTable, dest: Destination, old: dict, staging: str, result: TableResult) -> _Plan:
    """Compare the database's partitions (in _rows) with the manifest's entries `old`."""
    plan = _Plan()
    check: dict[int, str] = {}
    for pid, d, r, n, h in con.execute(
        "SELECT pid, d, r, count(*), sum(h) FROM _rows GROUP BY ALL ORDER BY pid"
    ).fetchall():
        path = partition_path(d.isoformat() if d is not None else None, r)
        plan.paths[pid], plan.totals[pid] = path, (n, int(h))
        before = old.get(path)
        if before is None:
            plan.modes[pid] = "all"
            result.new += 1
        elif before.get("rows") == n and before.get("hash") == str(int(h)):
            result.unchanged += 1
        else:
            check[pid] = path
    con.execute("CREATE OR REPLACE TEMP TABLE _done (pid BIGINT, file VARCHAR, k VARCHAR)")
    if check:
        _load_exported_keys(con, table, dest, old, check, staging)
        intact = _intact_partitions(con, old, check)
        for pid in check:
            plan.modes[pid] = "new" if pid in intact else "all"
            result.appended += pid in intact
            result.rewritten += pid not in intact
    return plan


def _stage_table(
    con,
    table: ExportTable,
    dest: Destination,
    manifest: dict,
    staging: str,
    export_id: str,
    meta: dict[str, str],
    runs: list[str] | None,
    since: dt.date | None,
    result: TableResult,
    pieces: _PieceWriter | None,
) -> _Staged:
    """Write the table's changed partitions to local files, with their key files, and say where
    they go, what they replace and the manifest entries that will list them."""
    _row_fingerprints(con, table, runs, since)
    old = manifest.get("tables", {}).get(table.name, {})
    plan = _plan(con, table, dest, old, staging, result)
    staged = _Staged()
    if not plan.modes:
        return staged
    con.execute("CREATE OR REPLACE TEMP TABLE _todo (pid BIGINT, mode VARCHAR)")
    con.executemany("INSERT INTO _todo VALUES (?, ?)", list(plan.modes.items()))
    out = os.path.join(staging, table.name)
    kv = _kv_metadata(meta | {"toolproxy.table": table.name})
    to_write = (
        "SELECT r.rid, r.pid FROM _rows r JOIN _todo USING (pid) WHERE _todo.mode = 'all' "
        "OR NOT EXISTS (SELECT 1 FROM _done x WHERE x.pid = r.pid AND x.k = r.k)"
    )
    if table.weight is None:
        con.execute(
            f"COPY (SELECT {table.select}, s.pid AS _pid FROM {table.name} t JOIN ({to_write}) s ON s.rid = t.rowid) "
            f"TO '{_sql_text(out)}' (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (_pid), KV_METADATA {{{kv}}}, "
            f"FILENAME_PATTERN 'part-{export_id}-{{i}}')"
        )
    else:
        _copy_in_batches(con, table, to_write, out, kv, export_id, pieces)
    written: dict[int, list[dict]] = {pid: [] for pid in plan.modes}
    for pid_dir in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        pid = int(pid_dir.split("=", 1)[1])
        for name in sorted(os.listdir(os.path.join(out, pid_dir))):
            local = os.path.join(out, pid_dir, name)
            entry = _key_file_for(con, table, local, pid)
            rel = f"{plan.paths[pid]}/{name}"
            staged.uploads += [(local, f"{table.name}/{rel}"), (local + ".keys", _key_file(table.name, rel))]
            written[pid].append({"name": name} | entry)
            result.rows += entry["rows"]
            result.files += 1
    for pid, mode in plan.modes.items():
        path = plan.paths[pid]
        before = old.get(path, {}).get("files", [])
        if mode == "all":
            for f in before:
                staged.obsolete += [f"{table.name}/{path}/{f['name']}", _key_file(table.name, f"{path}/{f['name']}")]
        n, h = plan.totals[pid]
        staged.partitions[path] = {
            "rows": n,
            "hash": str(h),
            "files": written[pid] if mode == "all" else before + written[pid],
            "schema_version": meta["toolproxy.schema_version"],
            "analyzer_version": meta["toolproxy.analyzer_version"],
        }
    if table.moves:
        _cut_moved_rows(con, table, dest, old, plan, staging, export_id, meta, staged, result)
    return staged


def _copy_in_batches(
    con, table: ExportTable, to_write: str, out: str, kv: str, export_id: str, pieces: _PieceWriter | None
) -> None:
    """Write the rows `to_write` selects as files of about _batch_bytes each, laid out as a
    partitioned COPY lays them out (out/_pid=N/part-ID-I.parquet).

    One COPY of a whole partition holds a row group of up to 122,880 rows, and DuckDB hands the
    bodies function 2,048 rows at once: with bodies of tens of KB (long episodes resend their whole
    history every turn) either one is gigabytes, past any memory limit. A batch of bounded bytes
    bounds both."""
    budget = _batch_bytes(con)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _batches AS SELECT s.rid, s.pid, coalesce(sum(w.w) OVER (PARTITION BY s.pid "
        f"ORDER BY s.rid ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) // {budget} AS b "
        f"FROM ({to_write}) s JOIN ({table.weight}) w USING (rid)"
    )
    batches = con.execute("SELECT pid, b, min(rid), max(rid) FROM _batches GROUP BY ALL ORDER BY ALL").fetchall()
    for pid, b, first, last in batches:
        folder = os.path.join(out, f"_pid={pid}")
        os.makedirs(folder, exist_ok=True)
        # the rowid range lets the scan skip the table's other row groups
        rows = (
            f"SELECT {table.select} FROM {table.name} t JOIN (SELECT rid FROM _batches WHERE pid = {int(pid)} "
            f"AND b = {int(b)}) s ON s.rid = t.rowid WHERE t.rowid BETWEEN {int(first)} AND {int(last)}"
        )
        target = os.path.join(folder, f"part-{export_id}-{int(b)}.parquet")
        if pieces is None:
            con.execute(
                f"COPY ({rows}) TO '{_sql_text(target)}' (FORMAT parquet, COMPRESSION zstd, KV_METADATA {{{kv}}})"
            )
        else:
            pieces.copy(con, rows, target, kv)
    con.execute("DROP TABLE _batches")


class _PieceWriter:
    """Writes a batch of exchanges with their bodies as piece hashes, and the batch's pieces the
    destination does not hold yet as one file of the pieces table, with a key file of its hashes.

    The hashes already written (`_seen`, a DuckDB table, so it spills under the memory limit
    rather than growing in Python) are loaded at the first batch, so an export with no new
    exchanges reads none, from the key files of the pieces files the manifest lists: from an
    object store the texts would come whole on every export, growing with everything ever
    exported. A pieces file whose key file is not listed (written before key files were) or not
    usable (missing, or not the rows of the files it indexes) is read itself, and its key file
    written from it lands with this export, so it is read once. Once an export reads
    _MERGE_KEY_FILES key files it writes them as one, which every listed pieces file then names,
    so an export every few minutes for a month reads a few files, not one per earlier export."""

    def __init__(self, dest: Destination, listed: list[dict], staging: str, export_id: str, meta: dict[str, str]):
        self.dest = dest
        self.staging, self.export_id = os.path.join(staging, PIECES_DIR), export_id
        self.kv = _kv_metadata(meta | {"toolproxy.table": PIECES_DIR})
        self.files: list[dict] = []
        self.listed = listed  # the manifest's entries, with the key files they name after this export
        self.key_uploads: list[tuple[str, str]] = []  # key files of listed pieces files, written now
        self.superseded: list[str] = []  # key files no listed pieces file names any more
        self.indexed = 0  # listed pieces files read to write their key file
        self.loaded = False
        os.makedirs(self.staging)

    def _load_seen(self, con) -> None:
        con.execute("CREATE OR REPLACE TEMP TABLE _seen (hash VARCHAR)")
        self.loaded = True
        if not self.listed:
            return
        present = self.dest.names(f"{KEYS_DIR}/{PIECES_DIR}")
        groups: dict[str, list[int]] = {}  # key file -> the listed pieces files it indexes
        for n, f in enumerate(self.listed):
            if f.get("keys") in present:
                groups.setdefault(f["keys"], []).append(n)
        local = self._local_copies(list(groups), "keys")
        counts = (
            dict(
                con.execute(
                    "SELECT file_name, num_rows FROM parquet_file_metadata(?::VARCHAR[])", [list(local.values())]
                ).fetchall()
            )
            if local
            else {}
        )
        usable = {
            rel
            for rel, members in groups.items()
            if counts.get(local[rel]) == sum(self.listed[n].get("rows", 0) for n in members)
        }
        entries = [dict(f) for f in self.listed]
        unkeyed = [n for n, f in enumerate(entries) if f.get("keys") not in usable]
        parts = self._local_copies([f"{PIECES_DIR}/{entries[n]['name']}" for n in unkeyed], "part")
        sources = [local[rel] for rel in usable]
        for n in unkeyed:
            sources.append(os.path.join(self.staging, f"rekeyed-{n}.keys"))
            entries[n]["rows"] = _write_piece_keys(con, parts[f"{PIECES_DIR}/{entries[n]['name']}"], sources[-1])
            entries[n]["keys"] = _key_file(PIECES_DIR, entries[n]["name"])
            self.key_uploads.append((sources[-1], entries[n]["keys"]))
        self.indexed = len(unkeyed)
        con.execute("INSERT INTO _seen SELECT hash FROM read_parquet(?::VARCHAR[])", [sources])
        if len(sources) >= _MERGE_KEY_FILES:
            merged = os.path.join(self.staging, "merged.keys")
            con.execute(f"COPY (SELECT hash FROM _seen) TO '{_sql_text(merged)}' (FORMAT parquet, COMPRESSION zstd)")
            rel = f"{KEYS_DIR}/{PIECES_DIR}/merged-{self.export_id}.keys"
            self.key_uploads = [(merged, rel)]
            entries = [f | {"keys": rel} for f in entries]
        named = {f["keys"] for f in entries}
        self.superseded = [rel for rel in groups if rel not in named]
        self.listed = entries

    def _local_copies(self, rels: list[str], kind: str) -> dict[str, str]:
        """A local path for each destination file: itself on a local disk, else a download."""
        if self.dest.local:
            return {rel: self.dest.path(rel) for rel in rels}
        local = {rel: os.path.join(self.staging, f"known-{n}.{kind}.parquet") for n, rel in enumerate(rels)}
        self.dest.get(list(local.items()))
        return local

    def copy(self, con, rows: str, target: str, kv: str) -> None:
        """Write the exchanges `rows` selects (with their bodies) to `target`, their new pieces beside."""
        if not self.loaded:
            self._load_seen(con)
        split = ", ".join(f"body_pieces({b}, {b}_encoding) AS _{b}" for b in BODY_FIELDS)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _split AS SELECT *, {split} FROM ({rows})")
        dropped = ", ".join(f"{b}, _{b}" for b in BODY_FIELDS)
        hashes = ", ".join(f"[p.h FOR p IN _{b}] AS {b.removesuffix('_body')}_pieces" for b in BODY_FIELDS)
        con.execute(
            f"COPY (SELECT * EXCLUDE ({dropped}), {hashes} FROM _split) TO '{_sql_text(target)}' "
            f"(FORMAT parquet, COMPRESSION zstd, KV_METADATA {{{kv}}})"
        )
        name = f"part-{self.export_id}-{len(self.files)}.parquet"
        local = os.path.join(self.staging, name)
        every = " UNION ALL ".join(f"SELECT unnest(_{b}) AS p FROM _split" for b in BODY_FIELDS)
        n = con.execute(
            f"COPY (SELECT p.h AS hash, any_value(p.t) AS text FROM ({every}) WHERE p.h NOT IN (SELECT hash FROM "
            "_seen) "
            f"GROUP BY p.h) TO '{_sql_text(local)}' (FORMAT parquet, COMPRESSION zstd, KV_METADATA {{{self.kv}}})"
        ).fetchone()[0]
        con.execute("DROP TABLE _split")
        if not n:
            os.remove(local)
            return
        _write_piece_keys(con, local, local + ".keys")
        con.execute(f"INSERT INTO _seen SELECT hash FROM read_parquet('{_sql_text(local)}.keys')")
        self.files.append({"name": name, "rows": int(n), "local": local})

    def uploads(self) -> list[tuple[str, str]]:
        """(local file, destination path) of every file written: new pieces files and key files."""
        new = [
            (f["local"] + suffix, rel)
            for f in self.files
            for suffix, rel in (("", f"{PIECES_DIR}/{f['name']}"), (".keys", _key_file(PIECES_DIR, f["name"])))
        ]
        return new + self.key_uploads

    def manifest_entries(self) -> list[dict]:
        """The pieces files the manifest lists after this export, each with its key file."""
        return self.listed + [
            {"name": f["name"], "rows": f["rows"], "keys": _key_file(PIECES_DIR, f["name"])} for f in self.files
        ]


def _write_piece_keys(con, part: str, keys: str) -> int:
    """Write the key file of pieces file `part`, its hash column alone; the pieces it holds."""
    return con.execute(
        f"COPY (SELECT hash FROM read_parquet('{_sql_text(part)}')) TO '{_sql_text(keys)}' "
        "(FORMAT parquet, COMPRESSION zstd)"
    ).fetchone()[0]


def _batch_bytes(con) -> int:
    """Input bytes per file of a table with bodies: a sixteenth of the memory limit, as a batch is
    held several times over (the bodies read in Python, DuckDB's vectors of them, the row group
    being encoded and compressed), by each of DuckDB's threads."""
    return max(memory_limit_of(con) // 16, 1 << 20)


def _cut_moved_rows(
    con,
    table: ExportTable,
    dest: Destination,
    old: dict,
    plan: _Plan,
    staging: str,
    export_id: str,
    meta: dict[str, str],
    staged: _Staged,
    result: TableResult,
) -> None:
    """Cut the old copies of rows that moved to another day out of the history partitions (those
    the manifest lists and the database no longer has) of the runs being written.

    A history file holding such a row is replaced by a new file of its other rows, with its own key
    file; its manifest entry keeps the versions it was made under and an empty fingerprint (no
    database row stands for history), so should the database ever hold that partition again it is
    rewritten from the database."""
    written_runs = {plan.paths[pid].rsplit("/", 1)[-1] for pid in plan.modes}
    current = set(plan.paths.values())
    history = dict(enumerate(sorted(p for p in old if p not in current and p.rsplit("/", 1)[-1] in written_runs)))
    if not history:
        return
    con.execute("CREATE OR REPLACE TEMP TABLE _history (pid BIGINT, file VARCHAR, k VARCHAR)")
    _load_exported_keys(con, table, dest, old, history, os.path.join(staging, "history-keys"), into="_history")
    stale = con.execute(
        "SELECT pid, file, count(*) FROM _history SEMI JOIN _rows USING (k) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    entries: dict[str, dict] = {}
    for n, (pid, name, moved) in enumerate(stale):
        path = history[pid]
        entry = entries.setdefault(path, dict(old[path], hash="", files=list(old[path].get("files", []))))
        rel = f"{path}/{name}"
        if dest.local:
            source = dest.path(f"{table.name}/{rel}")
        else:
            source = os.path.join(staging, "history", f"{n}.parquet")
            os.makedirs(os.path.dirname(source), exist_ok=True)
            dest.get([(f"{table.name}/{rel}", source)])
        local = os.path.join(staging, "history", table.name, str(pid), f"part-{export_id}-h{n}.parquet")
        os.makedirs(os.path.dirname(local), exist_ok=True)
        versions_then = {f"toolproxy.{k}": str(entry[k]) for k in ("schema_version", "analyzer_version") if k in entry}
        kv = _kv_metadata(meta | versions_then | {"toolproxy.table": table.name})
        kept = con.execute(
            f"COPY (SELECT t.* FROM read_parquet('{_sql_text(source)}', hive_partitioning=false) t "
            f"WHERE {table.key} NOT IN (SELECT k FROM _rows)) "
            f"TO '{_sql_text(local)}' (FORMAT parquet, COMPRESSION zstd, KV_METADATA {{{kv}}})"
        ).fetchone()[0]
        staged.obsolete += [f"{table.name}/{rel}", _key_file(table.name, rel)]
        files = [f for f in entry["files"] if f["name"] != name]
        if kept:
            con.execute(
                f"COPY (SELECT {table.key} AS k FROM read_parquet('{_sql_text(local)}', hive_partitioning=false) t) "
                f"TO '{_sql_text(local)}.keys' (FORMAT parquet, COMPRESSION zstd)"
            )
            new = os.path.basename(local)
            staged.uploads += [
                (local, f"{table.name}/{path}/{new}"),
                (local + ".keys", _key_file(table.name, f"{path}/{new}")),
            ]
            files.append({"name": new, "rows": int(kept), "hash": ""})
            result.files += 1
        entry["files"] = files
        entry["rows"] = sum(f.get("rows", 0) for f in files)
        result.stale += int(moved)
    for path, entry in entries.items():
        if entry["files"]:
            staged.partitions[path] = entry
        else:
            staged.dropped.append(path)


def _key_file_for(con, table: ExportTable, local: str, pid: int) -> dict:
    """Write the keys of staged data file `local` beside it; its manifest entry's rows and fingerprint."""
    keys = local + ".keys"
    con.execute(
        f"COPY (SELECT {table.key} AS k FROM read_parquet('{_sql_text(local)}', hive_partitioning=false) t) "
        f"TO '{_sql_text(keys)}' (FORMAT parquet, COMPRESSION zstd)"
    )
    n, h = con.execute(
        f"SELECT count(*), coalesce(sum(r.h), 0) FROM read_parquet('{_sql_text(keys)}') f "
        "JOIN _rows r ON r.k = f.k AND r.pid = ?",
        [pid],
    ).fetchone()
    return {"rows": n, "hash": str(int(h))}


def _kv_metadata(items: dict[str, str]) -> str:
    """The body of a COPY ... KV_METADATA {...} option: the files' key/value metadata."""
    return ", ".join(f"'{_sql_text(k)}': '{_sql_text(v)}'" for k, v in items.items())


def _sql_text(text: str) -> str:
    return text.replace("'", "''")


def _load_exported_keys(
    con, table: ExportTable, dest: Destination, old: dict, paths: dict[int, str], staging: str, into: str = "_done"
) -> None:
    """Fill `into` (pid, file, k) with the keys each listed file of these partitions holds (from its key file)."""
    mapping: list[tuple[str, int, str]] = []
    downloads: list[tuple[str, str]] = []
    for pid, path in paths.items():
        for f in old[path].get("files", []):
            rel = _key_file(table.name, f"{path}/{f['name']}")
            if not dest.exists(rel):
                continue  # the partition counts as changed: its file cannot be checked
            if dest.local:
                local = dest.path(rel)
            else:
                local = os.path.join(staging, "keys", f"{len(mapping)}.parquet")
                os.makedirs(os.path.dirname(local), exist_ok=True)
                downloads.append((rel, local))
            mapping.append((local, pid, f["name"]))
    if not mapping:
        return
    dest.get(downloads)
    con.execute("CREATE OR REPLACE TEMP TABLE _keyfiles (filename VARCHAR, pid BIGINT, file VARCHAR)")
    con.executemany("INSERT INTO _keyfiles VALUES (?, ?, ?)", mapping)
    con.execute(
        f"INSERT INTO {into} SELECT m.pid, m.file, f.k FROM read_parquet(?::VARCHAR[], filename=true, "
        "hive_partitioning=false) f JOIN _keyfiles m USING (filename)",
        [[m[0] for m in mapping]],
    )


def _intact_partitions(con, old: dict, paths: dict[int, str]) -> set[int]:
    """Partitions whose every exported file still holds exactly the rows the database has for it."""
    seen = {
        (pid, file): (n_exported, n_matched, int(h))
        for pid, file, n_exported, n_matched, h in con.execute(
            "SELECT x.pid, x.file, count(*), count(r.k), coalesce(sum(r.h), 0) FROM _done x "
            "LEFT JOIN _rows r ON r.k = x.k AND r.pid = x.pid GROUP BY ALL"
        ).fetchall()
    }
    intact = set()
    for pid, path in paths.items():
        ok = True
        for f in old[path].get("files", []):
            n_exported, n_matched, h = seen.get((pid, f["name"]), (None, None, None))
            if n_exported != f.get("rows") or n_matched != n_exported or str(h) != f.get("hash"):
                ok = False
                break
        if ok:
            intact.add(pid)
    return intact


def export(
    con,
    dest: Destination,
    *,
    data_dir: str | Path,
    runs: list[str] | None = None,
    since: dt.date | None = None,
    progress=None,
    layout: str = "whole",
) -> ExportResult:
    """Bring the Parquet export at `dest` in line with the database (see the module docstring).
    data_dir: the recordings the database was analysed from, where the exchanges' bodies are."""
    # bodies_in_sql leaves first: it retires a result left unfinished, which would keep body_pieces from being removed
    with _pieces_in_sql(con, layout), bodies_in_sql(con, data_dir):
        return _export(con, dest, runs=runs, since=since, progress=progress, layout=layout)


@contextlib.contextmanager
def _pieces_in_sql(con, layout: str):
    """While inside, `body_pieces(text, encoding)` is callable in SQL on `con` (analysis.export.pieces.split)."""
    if layout == "whole":
        yield
        return
    text = duckdb.type("VARCHAR")
    piece = duckdb.list_type(duckdb.struct_type({"h": text, "t": text}))
    con.create_function("body_pieces", split, [text, text], piece, null_handling="special", side_effects=False)
    try:
        yield
    finally:
        try:
            con.remove_function("body_pieces")
        except duckdb.Error:  # the connection was closed inside
            pass


def _export(
    con, dest: Destination, *, runs: list[str] | None, since: dt.date | None, progress, layout: str
) -> ExportResult:
    v = versions(con, layout)
    dest.check()
    result = ExportResult()
    manifest = _load_json(dest, MANIFEST)
    if manifest is not None and int(manifest.get("export_format_version", 0)) > FORMAT_VERSION:
        raise ExportError(
            f"{dest.url} was written by a newer toolproxy (export format {manifest.get('export_format_version')}, "
            f"this one reads up to {FORMAT_VERSION}); upgrade toolproxy to export there"
        )
    if manifest is not None and manifest.get("layout", "whole") != layout:
        raise ExportError(
            f"{dest.url} holds an export in the {manifest.get('layout', 'whole')!r} layout; export there with "
            f"--layout {manifest.get('layout', 'whole')}, or to another destination for the {layout!r} layout"
        )
    result.recovered = recover(dest, manifest, now=time.time())
    manifest = manifest or {"tables": {}}
    export_id = f"{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:12]}"
    meta = {f"toolproxy.{k}": str(val) for k, val in v.items()} | {"toolproxy.export_id": export_id}
    parent, prefix = (dest.path(STATE_DIR), STAGING) if dest.local else (tempfile.gettempdir(), TEMP_STAGING)
    _remove_stale_staging(parent, prefix, now=time.time(), by_age=dest.local)
    with _staging(parent, prefix, export_id) as staging:
        uploads: list[tuple[str, str]] = []
        obsolete: list[str] = []
        tables = {name: dict(parts) for name, parts in manifest.get("tables", {}).items()}
        pieces = (
            _PieceWriter(dest, manifest.get("pieces", []), staging, export_id, meta) if layout == "pieces" else None
        )
        for table in TABLES:
            if progress is not None:
                progress.show(f"export: comparing {table.name} with {dest.url}")
            tr = TableResult(table.name)
            s = _stage_table(
                con,
                table,
                dest,
                manifest,
                staging,
                export_id,
                meta,
                runs,
                since,
                tr,
                pieces if table.name == "exchanges" else None,
            )
            result.tables.append(tr)
            uploads += s.uploads
            obsolete += s.obsolete
            tables.setdefault(table.name, {}).update(s.partitions)
            for path in s.dropped:
                tables[table.name].pop(path, None)
        if pieces is not None:
            uploads += pieces.uploads()
            result.pieces, result.pieces_files = sum(f["rows"] for f in pieces.files), len(pieces.files)
            result.pieces_indexed = pieces.indexed
            obsolete += pieces.superseded
        if not uploads and not obsolete:
            return result
        result.export_id = export_id
        journal = {
            "export_id": export_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": time.time(),
            "new": [rel for _, rel in uploads],
            "obsolete": obsolete,
        }
        dest.write_bytes(PENDING, orjson.dumps(journal))
        sizes = [os.path.getsize(local) for local, _ in uploads]
        if progress is not None:
            progress.total, progress.done = float(sum(sizes)), 0.0
            progress.label = f"export: writing to {dest.url}"
        for start in range(0, len(uploads), _UPLOAD_BATCH):
            dest.put(uploads[start : start + _UPLOAD_BATCH])
            if progress is not None:
                progress.advance(sum(sizes[start : start + _UPLOAD_BATCH]))
        result.files = sum(t.files for t in result.tables) + result.pieces_files
        result.bytes = sum(sizes)
        new_manifest = {
            "format": "toolproxy-export",
            **v,
            "export_id": export_id,
            "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "exported_by": socket.gethostname(),
            "layout": layout,
            "tables": tables,
        }
        if pieces is not None:
            new_manifest["pieces"] = pieces.manifest_entries()
        dest.write_bytes(MANIFEST, orjson.dumps(new_manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        dest.delete(obsolete)
        dest.delete([PENDING])
        return result
