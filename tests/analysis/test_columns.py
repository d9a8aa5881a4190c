"""Which Python values fit which DuckDB column, checked against DuckDB itself."""

from __future__ import annotations

import duckdb
import pytest

from toolproxy.analysis.store.columns import Columns, misfit, share_strings
from toolproxy.analysis.store.connection import insert_columns

CASES = [
    # (sql type, value, fits)
    ("VARCHAR", "x", True),
    ("VARCHAR", 5, False),
    ("VARCHAR", {"a": 1}, False),
    ("VARCHAR", "\x00\x1b", True),
    ("INTEGER", 200, True),
    ("INTEGER", 2**31 - 1, True),
    ("INTEGER", 2**31, False),
    ("INTEGER", -(2**31), True),
    ("INTEGER", True, False),
    ("INTEGER", 200.0, False),
    ("INTEGER", "200", False),
    ("BIGINT", 2**63 - 1, True),
    ("BIGINT", 2**63, False),
    ("BIGINT", 2**64 - 1, False),
    ("DOUBLE", 1.5, True),
    ("DOUBLE", 3, True),
    ("DOUBLE", False, False),
    ("DOUBLE", "1.5", False),
    ("TIMESTAMP", 1.7e9, True),
    ("TIMESTAMP", 0, True),
    ("TIMESTAMP", -1.0, True),
    ("TIMESTAMP", 9.1e12, True),
    ("TIMESTAMP", 1e13, False),
    ("TIMESTAMP", 1e300, False),
    ("TIMESTAMP", "yesterday", False),
    ("BOOLEAN", True, True),
    ("BOOLEAN", 1, False),
    ("VARCHAR[]", ["a"], True),
    ("VARCHAR[]", ["a", 1], False),
    ("VARCHAR[]", "a", False),
]


@pytest.mark.parametrize("sql_type,value,fits", CASES)
def test_misfit_agrees_with_duckdb(sql_type, value, fits):
    assert (misfit("c", value, sql_type) is None) is fits
    if not fits:
        return
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t (c {sql_type})")
    assert insert_columns(con, "t", {"c": [value]}, {"c": sql_type}) == 1
    con.close()


def test_misfit_names_the_field_and_the_value():
    assert misfit("status", 1099511627776, "INTEGER") == (
        '"status" is 1099511627776 (a number), which does not fit a 32-bit integer'
    )
    long = misfit("run", "x" * 100, "INTEGER")
    assert long == '"run" is "' + "x" * 58 + "… (a string), which does not fit a 32-bit integer"
    assert misfit("b", 2**70, "BIGINT").startswith('"b" is 1180591620717411303424 (a number)')
    columns = Columns({"a": "VARCHAR", "b": "INTEGER", "c": "VARCHAR"})
    assert columns.misfit({"a": "ok", "b": None, "c": 7}).startswith('"c" is 7')
    assert columns.misfit({"a": "ok", "b": 2**31}).startswith('"b" is 2147483648')
    assert columns.misfit({"a": "ok", "b": 5, "extra": {}}) is None


def test_misfits_finds_the_rows_and_fit_makes_the_rest_fit():
    columns = Columns({"a": "VARCHAR", "b": "BIGINT", "c": "JSON", "d": "VARCHAR[]", "e": "TIMESTAMP"})
    good = {"a": ["x", None], "b": [5, 0], "c": ["{}", None], "d": [["n"], None], "e": [1.7e9, 0]}
    assert columns.misfits(good, list(good)) == {}
    assert columns.fit(good) == good
    odd = {"a": [{"k": 1}, "y"], "b": [2**64 - 1, True], "c": [3, "1"], "d": [["n", 1], []], "e": [1e300, "x"]}
    assert columns.misfits(odd, ["a", "e"]) == {
        0: '"a" is {"k":1} (an object), which does not fit a string',
        1: '"e" is "x" (a string), which does not fit a time in seconds since 1970',
    }
    assert columns.fit(odd) == {
        "a": ['{"k":1}', "y"],
        "b": [None, None],
        "c": ["3", "1"],
        "d": [None, []],
        "e": [None, None],
    }


def test_insert_columns_stores_what_does_not_fit_instead_of_aborting_the_transaction():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (s VARCHAR, n BIGINT, ts TIMESTAMP)")
    con.execute("BEGIN TRANSACTION")
    types = {"s": "VARCHAR", "n": "BIGINT", "ts": "TIMESTAMP"}
    insert_columns(con, "t", {"s": ["ok", {"k": 1}], "n": [1, "many"], "ts": [0, "yesterday"]}, types)
    con.execute("COMMIT")
    assert con.execute("SELECT s, n, epoch(ts) FROM t ORDER BY n NULLS LAST").fetchall() == [
        ("ok", 1, 0.0),
        ('{"k":1}', None, None),
    ]
    con.close()


@pytest.mark.parametrize(
    "values",
    [
        ["run-a", "".join(["run-", "a"]), None, "run-b", None],  # two equal strings, two objects
        [],
        [1, 1.0, True, "1"],  # equal as dict keys, not as column values
        ["x", b"x", "x"],
    ],
)
def test_share_strings_keeps_every_value_and_shares_only_equal_strings(values):
    shared = share_strings(values)
    assert list(shared) == values and [type(v) for v in shared] == [type(v) for v in values]
    if not set(map(type, values)) <= {str, type(None)}:
        assert shared is values  # a column of other types comes back as it was
    else:
        firsts = {}
        assert all(v is firsts.setdefault(v, v) for v in shared)
