"""`toolproxy export --layout pieces`: bodies cut into content-addressed pieces that rebuild the
recorded text byte for byte, with DuckDB's SQL alone, from real exported files."""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
import uuid
from pathlib import Path

import duckdb
import fsspec
import orjson
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from test_export import age_journal, killed_at_the_manifest, killed_in, run_cli

from toolproxy.analysis.export import parquet
from toolproxy.analysis.export.destination import Destination
from toolproxy.analysis.export.pieces import piece_hash, split
from toolproxy.analysis.store.connection import connect
from toolproxy.record.model import Record, encode_body, new_id
from toolproxy.record.segments import read_records
from toolproxy.record.writer import SEGMENT_DIR
from toolproxy.testing.corpus import episode, generate, interleaved


def _rebuilt(text: str, encoding: str = "utf8") -> list[str]:
    pieces = split(text, encoding)
    assert "".join(p["t"] for p in pieces) == text
    assert all(p["h"] == piece_hash(p["t"]) for p in pieces)
    return [p["t"] for p in pieces]


def test_a_chat_request_is_cut_after_each_message_and_tool():
    messages = [{"role": "system", "content": 'be [brief], "ok" {}'}, {"role": "user", "content": "a\\"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    short = json.dumps({"model": "m", "messages": messages, "tools": tools, "stream": False})
    longer = json.dumps(
        {"model": "m", "messages": messages + [{"role": "assistant", "content": "x"}], "tools": tools, "stream": False}
    )
    a, b = _rebuilt(short), _rebuilt(longer)
    assert len(a) == 4 and len(b) == 5
    assert a[:2] == b[:2] and a[2:] == b[3:]  # the longer request repeats every piece of the shorter one


def test_scalars_stay_together_so_a_token_id_prompt_is_not_a_hash_per_token():
    """A /v1/completions prompt of token ids: a piece (and a 64-character hash) per id would be
    several times the body."""
    text = json.dumps({"model": "m", "prompt": list(range(2000)), "max_tokens": 8})
    assert len(_rebuilt(text)) == 1
    mixed = json.dumps({"messages": [1, {"role": "user"}, "x", [2]], "n": [3, 4]})
    assert _rebuilt(mixed) == ['{"messages": [1, {"role": "user"}', ', "x", [2]', '], "n": [3, 4]}']


@pytest.mark.parametrize("seed", range(20))
def test_any_whitespace_and_key_order_rebuilds_exactly(seed: int):
    rnd = random.Random(seed)
    value = {
        f"k{i}": rnd.choice(
            [
                [{"a": [1, {"b": ']}\\"['}], "c": None}] * rnd.randint(0, 3),
                "s\u00e9\U0001f642",
                2.5e-3,
                [],
                {},
                [[1, 2], [3]],
                True,
            ]
        )
        for i in range(rnd.randint(0, 6))
    }
    keys = list(value)
    rnd.shuffle(keys)
    text = json.dumps(
        {k: value[k] for k in keys},
        indent=rnd.choice([None, 0, 2, "\t"]),
        ensure_ascii=rnd.random() < 0.5,
        separators=rnd.choice([None, (",", ":"), (" ,\n", " :  ")]),
    )
    _rebuilt(" \r\n" * rnd.randint(0, 1) + text + "\n" * rnd.randint(0, 2))


@pytest.mark.parametrize(
    "text, encoding",
    [
        ("", "utf8"),
        ("not json", "utf8"),
        ("[1, 2]", "utf8"),
        ('"s"', "utf8"),
        ('{"a": [1,', "utf8"),
        ('{"a": [1]} trailing', "utf8"),
        ('data: {"a": [1]}\n\n', "utf8"),
        ('{"a": [1, 2]}', "base64"),
        ("\ud800 lone surrogate", "utf8"),
    ],
)
def test_anything_else_is_one_piece(text: str, encoding: str):
    assert _rebuilt(text, encoding) == [text]
    assert split(None, None) is None


def documented_rebuild() -> str:
    """The rebuild query of docs/export.md, for any body column and export folder."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "export.md").read_text()
    sql = next(block for block in re.findall(r"```sql\n(.*?)```", doc, re.S) if "string_agg" in block)
    return sql.replace("'export/", "'{out}/").replace("request", "{col}").strip().rstrip(";")


REBUILD = documented_rebuild()


def rebuilt_bodies(out: Path | str, con=None) -> dict[str, tuple]:
    """Every exported exchange's bodies rebuilt by the SQL docs/export.md gives, with DuckDB alone."""
    con = con or duckdb.connect()
    bodies = {
        row[0]: [None, None, None, *row[1:]]
        for row in con.execute(
            "SELECT id, request_body_encoding, response_body_encoding, client_body_encoding "
            f"FROM read_parquet('{out}/exchanges/**/*.parquet')"
        ).fetchall()
    }
    for n, col in enumerate(("request", "response", "client")):
        for i, body in con.execute(REBUILD.format(col=col, out=out)).fetchall():
            bodies[i][n] = body
    return {i: tuple(v) for i, v in bodies.items()}


def recorded_bodies(data: Path) -> dict[str, tuple]:
    fields = [f"{b}_body" for b in ("request", "response", "client")]
    return {
        r["id"]: tuple(r.get(f) for f in fields) + tuple(r.get(f"{f}_encoding") for f in fields)
        for r in read_records(data, kind="exchange")
    }


def write_episodes(data: Path, name: str, seeds: range, turns: int) -> None:
    records = interleaved([episode(random.Random(n), n, turns, 3000) for n in seeds])
    (data / SEGMENT_DIR).mkdir(parents=True, exist_ok=True)
    with open(data / SEGMENT_DIR / f"{name}.jsonl", "wb") as f:
        for rec in records:
            f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))


ODD_BODIES = [
    b"\xff\xfe binary \x00",  # recorded as base64
    b"",
    None,
    b"not json [1, 2]",
    b'["a", "b"]',
    b' {\n "stream" : true ,\r\n\t"messages":[ {"content":"\\u00e9 \\"]}\\"", "role":"user"} ,\n{"role":"tool"}\t],'
    b'"tools": [], "model":"m"}\n\n',
    '{"messages": [{"role": "user", "content": "\u00e9\U0001f642\x1b[31m"}], "tools": [[1], {"a": [2]}]}'.encode(),
]


def write_odd_bodies(data: Path) -> None:
    """Bodies of every shape a client may send, as request and as reply."""
    seg = data / SEGMENT_DIR
    seg.mkdir(parents=True, exist_ok=True)
    with open(seg / "20261129T110000-1-0001-odd.jsonl", "wb") as f:
        for n, body in enumerate(ODD_BODIES):
            rec = Record(
                id=new_id(),
                started_at=1764000000.0 + n,
                upstream="http://127.0.0.1:9",
                method="POST",
                path="/v1/chat/completions",
                client_path="/v1/chat/completions",
                run="odd",
                episode=f"e{n}",
            )
            rec.request_body, rec.request_body_encoding = encode_body(body)
            rec.response_body, rec.response_body_encoding = encode_body(ODD_BODIES[-1 - n])
            rec.client_body, rec.client_body_encoding = encode_body(ODD_BODIES[n - 1])  # what a condition sent instead
            rec.status = rec.client_status = 200
            rec.response_complete, rec.ended_at = True, rec.started_at + 0.01
            f.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))


def test_the_documented_sql_rebuilds_every_body_byte_for_byte(tmp_path: Path):
    data = tmp_path / "data"
    generate(data, 300)  # mixed stacks: streamed replies, tool calls in several formats, errors
    write_odd_bodies(data)
    write_episodes(data, "20261129T120000-1-0001-host", range(3), 12)
    run_cli("analyze", "--data", str(data))
    out = tmp_path / "out"
    proc = run_cli("export", "--layout", "pieces", "--data", str(data), "--out", str(out))
    assert "pieces:" in proc.stdout
    recorded = recorded_bodies(data)
    assert len(recorded) > 300 and {v[5] for v in recorded.values()} >= {"base64", "utf8", None}
    assert rebuilt_bodies(out) == recorded
    columns = {
        r[0]
        for r in duckdb.connect()
        .execute(f"DESCRIBE SELECT * FROM read_parquet('{out}/exchanges/**/*.parquet')")
        .fetchall()
    }
    assert {"request_pieces", "response_pieces", "client_pieces"} <= columns
    assert not {"request_body", "response_body", "client_body"} & columns
    # each piece stored once, under its own content's hash, as DuckDB computes it
    n, distinct, misnamed = (
        duckdb.connect()
        .execute(
            f"SELECT count(*), count(DISTINCT hash), count(*) FILTER (WHERE sha256(text) <> hash) "
            f"FROM read_parquet('{out}/pieces/*.parquet')"
        )
        .fetchone()
    )
    assert n == distinct and misnamed == 0

    # new traffic: only its new pieces are written, none twice; a second run writes nothing
    write_episodes(data, "20261129T130000-1-0002-host", range(2, 5), 14)  # episode 2 again, grown: mostly known pieces
    run_cli("analyze", "--data", str(data))
    before = set((out / "pieces").iterdir())
    run_cli("export", "--layout", "pieces", "--data", str(data), "--out", str(out))
    assert set((out / "pieces").iterdir()) > before
    assert rebuilt_bodies(out) == recorded_bodies(data)
    n, distinct = (
        duckdb.connect()
        .execute(f"SELECT count(*), count(DISTINCT hash) FROM read_parquet('{out}/pieces/*.parquet')")
        .fetchone()
    )
    assert n == distinct
    assert (
        "nothing new to export"
        in run_cli("export", "--layout", "pieces", "--data", str(data), "--out", str(out)).stdout
    )

    # the other layout into the same destination is refused, without a traceback
    proc = run_cli("export", "--data", str(data), "--out", str(out), check=False)
    assert proc.returncode != 0 and "--layout pieces" in proc.stderr


def export_bytes(tmp_path: Path, turns: int, layout: str) -> int:
    """The Parquet bytes of the exchanges (and their pieces) of four concurrent episodes of `turns` turns."""
    data = tmp_path / f"data-{turns}"
    if not data.exists():
        write_episodes(data, "20261129T120000-1-0001-host", range(4), turns)
        run_cli("analyze", "--data", str(data))
    out = tmp_path / f"out-{turns}-{layout}"
    run_cli("export", "--layout", layout, "--data", str(data), "--out", str(out))
    return sum(p.stat().st_size for folder in ("exchanges", "pieces") for p in (out / folder).rglob("*.parquet"))


def test_pieces_grow_linearly_with_episode_length_where_whole_bodies_grow_quadratically(tmp_path: Path):
    whole = export_bytes(tmp_path, 80, "whole") / export_bytes(tmp_path, 20, "whole")
    pieces = export_bytes(tmp_path, 80, "pieces") / export_bytes(tmp_path, 20, "pieces")
    print(f"4x the turns: whole layout {whole:.1f}x the bytes, pieces layout {pieces:.1f}x")
    assert whole > 8  # 12x measured (zstd finds some of the repeats): each request resends the conversation so far
    assert pieces < 5  # 3.6x measured: each message is stored once


@contextlib.contextmanager
def memory_reads(url: str):
    """Inside, every file read from fsspec's memory filesystem, by path under `url`: what the
    destination was asked for, from the filesystem's side."""
    root = fsspec.core.url_to_fs(url)[1].rstrip("/") + "/"
    reads: list[str] = []
    real_open, real_cat = MemoryFileSystem._open, MemoryFileSystem.cat_file

    def seen(path: str) -> None:
        path = MemoryFileSystem._strip_protocol(path)
        if path.startswith(root):
            reads.append(path[len(root) :])

    def opened(self, path, mode="rb", *args, **kwargs):
        if "r" in mode:
            seen(path)
        return real_open(self, path, mode, *args, **kwargs)

    def cat(self, path, *args, **kwargs):
        seen(path)
        return real_cat(self, path, *args, **kwargs)

    MemoryFileSystem._open, MemoryFileSystem.cat_file = opened, cat
    try:
        yield reads
    finally:
        MemoryFileSystem._open, MemoryFileSystem.cat_file = real_open, real_cat


def export_pieces(data: Path, url: str) -> parquet.ExportResult:
    con = connect(data / "toolproxy.duckdb", read_only=True)
    try:
        return parquet.export(con, Destination(url), data_dir=data, layout="pieces")
    finally:
        con.close()


def memory_url(name: str) -> str:
    """A bucket of fsspec's memory filesystem no other test uses (it lives as long as the process)."""
    return f"memory://pieces-{uuid.uuid4().hex}/{name}"


def memory_reader() -> duckdb.DuckDBPyConnection:
    reader = duckdb.connect()
    reader.register_filesystem(fsspec.filesystem("memory"))
    return reader


def manifest_of(url: str) -> dict:
    fs, root = fsspec.core.url_to_fs(url)
    return orjson.loads(fs.cat_file(f"{root}/{parquet.MANIFEST}"))


def assert_each_piece_once_and_indexed(url: str, reader) -> int:
    """Every piece once, every pieces file listed with a key file, each key file holding exactly
    the hashes of the pieces files naming it; the pieces' count."""
    n, distinct = reader.execute(
        f"SELECT count(*), count(DISTINCT hash) FROM read_parquet('{url}/pieces/*.parquet')"
    ).fetchone()
    assert n == distinct
    indexes: dict[str, list[dict]] = {}
    for f in manifest_of(url)["pieces"]:
        indexes.setdefault(f["keys"], []).append(f)
    for keys, parts in indexes.items():
        assert keys.startswith(f"{parquet.KEYS_DIR}/pieces/")
        files = [f"{url}/pieces/{f['name']}" for f in parts]
        held = sorted(h for (h,) in reader.execute("SELECT hash FROM read_parquet(?::VARCHAR[])", [files]).fetchall())
        assert sorted(h for (h,) in reader.execute(f"SELECT hash FROM read_parquet('{url}/{keys}')").fetchall()) == held
        assert len(held) == sum(f["rows"] for f in parts)
    return n


def checked_export(data: Path, url: str, reader) -> tuple[parquet.ExportResult, set[str]]:
    """Export to `url` and check every body and piece there; the result, and the files the export read there."""
    with memory_reads(url) as reads:
        result = export_pieces(data, url)
    assert rebuilt_bodies(url, reader) == recorded_bodies(data)
    assert_each_piece_once_and_indexed(url, reader)
    return result, set(reads)


def test_an_object_store_destination_gets_only_the_pieces_it_lacks(tmp_path: Path):
    """The hashes already exported come back from the key files beside the remote pieces files
    (fsspec's memory filesystem), never from the pieces' texts; an export with nothing new reads neither."""
    data = tmp_path / "data"
    write_episodes(data, "20261129T120000-1-0001-host", range(2), 10)
    run_cli("analyze", "--data", str(data))
    url = memory_url("export")
    first = export_pieces(data, url)
    write_episodes(data, "20261129T130000-1-0002-host", range(1, 2), 12)  # episode 1 again, two turns longer
    run_cli("analyze", "--data", str(data))
    with memory_reads(url) as reads:
        second = export_pieces(data, url)
    assert 0 < second.pieces < first.pieces / 4  # a grown copy of episode 1: mostly messages already exported
    assert not [r for r in reads if r.startswith("pieces/")]
    assert {
        f"{parquet.KEYS_DIR}/pieces/{f['name']}.keys" for f in manifest_of(url)["pieces"][: first.pieces_files]
    } <= set(reads)
    reader = memory_reader()
    assert rebuilt_bodies(url, reader) == recorded_bodies(data)
    assert assert_each_piece_once_and_indexed(url, reader) == first.pieces + second.pieces
    with memory_reads(url) as reads:
        assert export_pieces(data, url).export_id is None
    assert not [r for r in reads if "pieces" in r]


def test_many_key_files_are_merged_into_one_so_later_exports_read_a_few(tmp_path: Path, monkeypatch):
    """An export that reads _MERGE_KEY_FILES key files writes them as one, which every pieces file
    listed then names, and the key files it replaces go: the next export reads that one and the
    key files of what came since, and still no pieces file."""
    monkeypatch.setattr(parquet, "_MERGE_KEY_FILES", 3)
    data = tmp_path / "data"
    url = memory_url("merged")
    fs, root = fsspec.core.url_to_fs(url)
    reader = memory_reader()

    def grow_and_export(n: int) -> list[str]:
        write_episodes(data, f"20261129T12000{n}-1-0001-host", range(2 * n, 2 * n + 2), 4)
        run_cli("analyze", "--data", str(data))
        result, reads = checked_export(data, url, reader)
        assert result.pieces_files == 1 and not [r for r in reads if r.startswith("pieces/")]
        return sorted(r for r in reads if r.startswith(f"{parquet.KEYS_DIR}/pieces/"))

    def key_files() -> list[str]:
        return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/{parquet.KEYS_DIR}/pieces", detail=False))

    for n in range(3):
        assert len(grow_and_export(n)) == n
    assert len(key_files()) == 3
    assert len(grow_and_export(3)) == 3  # reads three, writes them as one
    listed = manifest_of(url)["pieces"]
    merged = {f["keys"] for f in listed[:3]}
    assert len(merged) == 1 and next(iter(merged)).rsplit("/", 1)[-1].startswith("merged-")
    assert key_files() == sorted([next(iter(merged)).rsplit("/", 1)[-1], f"{listed[3]['name']}.keys"])
    assert grow_and_export(4) == sorted([next(iter(merged)), listed[3]["keys"]])


def killed_at_the_deletions(monkeypatch):
    """An export killed as it deletes the files its new manifest no longer lists."""
    return killed_in(monkeypatch, "delete", lambda rels: rels and rels != [parquet.PENDING])


@pytest.mark.parametrize(
    "killed, recovered",
    [(killed_at_the_manifest, "undid"), (killed_at_the_deletions, "finished")],
    ids=["at-the-manifest", "at-the-deletions"],
)
def test_an_export_killed_as_it_merges_key_files_is_undone_or_finished(tmp_path: Path, monkeypatch, killed, recovered):
    """Killed before its manifest, the merged key file goes and the key files it would replace
    stay listed; killed after, the replaced ones go. Either way every key file there is one the
    manifest names, and each holds exactly the hashes of its pieces files."""
    monkeypatch.setattr(parquet, "_MERGE_KEY_FILES", 2)
    data = tmp_path / "data"
    out = tmp_path / "out"
    keys = out / parquet.KEYS_DIR / "pieces"
    for n in range(3):
        write_episodes(data, f"20261129T12000{n}-1-0001-host", range(2 * n, 2 * n + 2), 4)
        run_cli("analyze", "--data", str(data))
        if n < 2:
            run_cli("export", "--layout", "pieces", "--data", str(data), "--out", str(out))
    singles = {p.name for p in keys.iterdir()}
    assert len(singles) == 2
    con = connect(data / "toolproxy.duckdb", read_only=True)
    try:
        with killed(monkeypatch):
            parquet.export(con, Destination(str(out)), data_dir=data, layout="pieces")
        assert singles < {p.name for p in keys.iterdir()} and any(p.name.startswith("merged-") for p in keys.iterdir())
        age_journal(out)
        result = parquet.export(con, Destination(str(out)), data_dir=data, layout="pieces")  # merges again, if undone
    finally:
        con.close()
    assert result.recovered.startswith(recovered)
    named = {f["keys"].rsplit("/", 1)[-1] for f in orjson.loads((out / parquet.MANIFEST).read_bytes())["pieces"]}
    assert {p.name for p in keys.iterdir()} == named and not singles & named
    assert rebuilt_bodies(out) == recorded_bodies(data)
    assert_each_piece_once_and_indexed(str(out), duckdb.connect())


def _unlist_keys(url: str, tmp_path: Path) -> set[str]:
    """Make the destination as the previous export format left it: pieces files, no key files."""
    fs, root = fsspec.core.url_to_fs(url)
    manifest = manifest_of(url)
    for f in manifest["pieces"]:
        fs.rm_file(f"{root}/{f.pop('keys')}")
    fs.pipe_file(f"{root}/{parquet.MANIFEST}", orjson.dumps(manifest))
    return {f"pieces/{f['name']}" for f in manifest["pieces"]}


def _delete_a_key_file(url: str, tmp_path: Path) -> set[str]:
    fs, root = fsspec.core.url_to_fs(url)
    first = manifest_of(url)["pieces"][0]
    fs.rm_file(f"{root}/{first['keys']}")
    return {f"pieces/{first['name']}"}


def _cut_a_key_file(url: str, tmp_path: Path) -> set[str]:
    """A key file that lists fewer hashes than its pieces file holds."""
    fs, root = fsspec.core.url_to_fs(url)
    first = manifest_of(url)["pieces"][0]
    cut = tmp_path / "cut.keys"
    memory_reader().execute(
        f"COPY (SELECT hash FROM read_parquet('{url}/{first['keys']}') LIMIT 1) TO '{cut}' (FORMAT parquet)"
    )
    fs.pipe_file(f"{root}/{first['keys']}", cut.read_bytes())
    return {f"pieces/{first['name']}"}


@pytest.mark.parametrize("damage", [_unlist_keys, _delete_a_key_file, _cut_a_key_file])
def test_pieces_files_without_a_usable_key_file_are_read_once_and_indexed(tmp_path: Path, damage):
    """A destination the previous format wrote (no key files), or one whose key file went: the
    next export reads those pieces files themselves, so it still writes no piece twice, and
    writes their key files, so the export after it reads only key files."""
    data = tmp_path / "data"
    write_episodes(data, "20261129T120000-1-0001-host", range(2), 8)
    run_cli("analyze", "--data", str(data))
    url = memory_url("old")
    export_pieces(data, url)
    write_episodes(data, "20261129T123000-1-0001-host", range(6, 7), 8)
    run_cli("analyze", "--data", str(data))
    export_pieces(data, url)
    assert len(manifest_of(url)["pieces"]) == 2  # so a key file damaged is told from one intact
    damaged = damage(url, tmp_path)
    write_episodes(data, "20261129T130000-1-0002-host", range(1, 3), 10)
    run_cli("analyze", "--data", str(data))
    reader = memory_reader()
    result, reads = checked_export(data, url, reader)
    assert result.pieces_indexed == len(damaged) and {r for r in reads if r.startswith("pieces/")} == damaged
    write_episodes(data, "20261129T140000-1-0003-host", range(2, 4), 10)
    run_cli("analyze", "--data", str(data))
    result, reads = checked_export(data, url, reader)
    assert result.pieces_indexed == 0 and not [r for r in reads if r.startswith("pieces/")]


def export_formats(out: Path) -> tuple[int, set[str]]:
    """The export format the manifest at `out` says, and the ones its data files' metadata say."""
    manifest = orjson.loads((out / parquet.MANIFEST).read_bytes())
    files = duckdb.sql(
        f"SELECT value::VARCHAR FROM parquet_kv_metadata('{out}/*/**/*.parquet') "
        "WHERE key::VARCHAR = 'toolproxy.export_format_version'"
    ).fetchall()
    return manifest["export_format_version"], {v for (v,) in files}


def test_only_the_pieces_layout_is_format_2_so_older_toolproxies_still_export_whole(tmp_path: Path):
    """A whole-layout destination is what format 1 wrote (its manifest's `layout` is ignored by
    format 1, which means whole without it), so it says 1 and a toolproxy that refuses any format
    above 1 still exports there; a format-1 destination, and one an earlier export marked 2, are
    exported to as format 1. A format newer than this toolproxy reads is refused."""
    data = tmp_path / "data"
    write_episodes(data, "20261129T120000-1-0001-host", range(2), 3)
    run_cli("analyze", "--data", str(data))
    for layout, expected in (("whole", 1), ("pieces", 2)):
        out = tmp_path / layout
        run_cli("export", "--layout", layout, "--data", str(data), "--out", str(out))
        assert export_formats(out) == (expected, {str(expected)})
    out = tmp_path / "whole"
    manifest = orjson.loads((out / parquet.MANIFEST).read_bytes())
    format_1 = {k: v for k, v in manifest.items() if k != "layout"}
    for n, before in enumerate((format_1, manifest | {"export_format_version": 2})):
        (out / parquet.MANIFEST).write_bytes(orjson.dumps(before))
        write_episodes(data, f"20261129T13000{n}-1-0002-host", range(4 + n, 5 + n), 2)
        run_cli("analyze", "--data", str(data))
        assert "nothing new" not in run_cli("export", "--data", str(data), "--out", str(out)).stdout
        assert export_formats(out) == (1, {"1"})
    newer = orjson.loads((out / parquet.MANIFEST).read_bytes()) | {"export_format_version": parquet.FORMAT_VERSION + 1}
    (out / parquet.MANIFEST).write_bytes(orjson.dumps(newer))
    proc = run_cli("export", "--data", str(data), "--out", str(out), check=False)
    assert proc.returncode == 2 and "written by a newer toolproxy" in proc.stderr


def test_a_layout_for_spans_is_a_usage_error(tmp_path: Path):
    data = tmp_path / "data"
    write_episodes(data, "20261129T120000-1-0001-host", range(1), 2)
    proc = run_cli("export", "--layout", "pieces", "--otlp", "http://127.0.0.1:9", "--data", str(data), check=False)
    assert proc.returncode == 2 and "--layout applies to --out" in proc.stderr


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "previous-format"])
def test_the_pieces_of_an_interrupted_export_are_undone_by_the_next(tmp_path: Path, monkeypatch, keyed: bool):
    """An export killed before its manifest leaves pieces files and key files the manifest does not
    list: the next one deletes them (its journal named them) and writes the pieces again. Key files
    it wrote for a previous format's pieces files go too, so the manifest never lists a key file
    that is not there, and the next export writes them again."""
    data = tmp_path / "data"
    write_episodes(data, "20261129T120000-1-0001-host", range(2), 6)
    run_cli("analyze", "--data", str(data))
    out = tmp_path / "out"
    run_cli("export", "--layout", "pieces", "--data", str(data), "--out", str(out))
    keys = out / parquet.KEYS_DIR / "pieces"
    if not keyed:
        shutil.rmtree(keys)
        manifest = orjson.loads((out / parquet.MANIFEST).read_bytes())
        (out / parquet.MANIFEST).write_bytes(
            orjson.dumps(
                manifest | {"pieces": [{k: v for k, v in f.items() if k != "keys"} for f in manifest["pieces"]]}
            )
        )
    committed = set((out / "pieces").iterdir())
    write_episodes(data, "20261129T130000-1-0002-host", range(2, 4), 6)
    run_cli("analyze", "--data", str(data))
    con = connect(data / "toolproxy.duckdb", read_only=True)
    try:
        with killed_at_the_manifest(monkeypatch):
            parquet.export(con, Destination(str(out)), data_dir=data, layout="pieces")
        crashed = set((out / "pieces").iterdir()) - committed
        assert crashed and {f"{p.name}.keys" for p in crashed} <= {p.name for p in keys.iterdir()}
        assert len(list(keys.iterdir())) == len(crashed) + len(committed)
    finally:
        con.close()
    age_journal(out)
    proc = run_cli("export", "--layout", "pieces", "--data", str(data), "--out", str(out))
    assert re.search(r"^undid the interrupted export .*^pieces: [1-9][0-9,]* new", proc.stdout, re.S | re.M), (
        proc.stdout
    )
    assert (f"pieces: {len(committed)} files exported without a key file" in proc.stdout) is not keyed
    listed = orjson.loads((out / parquet.MANIFEST).read_bytes())["pieces"]
    assert {p.name for p in (out / "pieces").iterdir()} == {f["name"] for f in listed} and not crashed & set(
        (out / "pieces").iterdir()
    )
    assert {p.name for p in keys.iterdir()} == {f"{f['name']}.keys" for f in listed} and all(
        "keys" in f for f in listed
    )
    assert rebuilt_bodies(out) == recorded_bodies(data)
    assert_each_piece_once_and_indexed(str(out), duckdb.connect())
