"""The writer connection: small row groups (so ingest appends skip the WAL) and one shared
attachment per file within a process."""

from __future__ import annotations

from toolproxy.analysis.store.connection import WRITER_ROW_GROUP_SIZE, connect


def test_writer_fills_small_row_groups(tmp_path):
    con = connect(tmp_path / "x.duckdb")
    con.execute(f"CREATE TABLE t AS SELECT range AS i FROM range({3 * WRITER_ROW_GROUP_SIZE})")
    con.execute("CHECKPOINT")
    groups = con.execute("SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('t')").fetchall()[0][0]
    assert groups == 3
    con.close()


def test_second_writer_in_one_process_shares_the_database(tmp_path):
    first = connect(tmp_path / "x.duckdb")
    first.execute("CREATE TABLE t (i INTEGER)")
    first.execute("INSERT INTO t VALUES (1)")
    second = connect(tmp_path / "x.duckdb")
    assert second.execute("SELECT i FROM t").fetchall() == [(1,)]
    second.execute("INSERT INTO t VALUES (2)")
    assert first.execute("SELECT sum(i) FROM t").fetchall() == [(3,)]
    second.close()
    first.close()
    reopened = connect(tmp_path / "x.duckdb", read_only=True)
    assert reopened.execute("SELECT sum(i) FROM t").fetchall() == [(3,)]
    reopened.close()


def test_migrations_build_exactly_the_declared_tables(tmp_path):
    """tables.py declares each table's columns once; the numbered steps must arrive at it."""
    from toolproxy.analysis.store.tables import TABLES

    con = connect(tmp_path / "x.duckdb")
    for table in TABLES:
        got = con.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? ORDER BY "
            "ordinal_position",
            [table.name],
        ).fetchall()
        assert got == list(table.types.items()), table.name
    con.close()
