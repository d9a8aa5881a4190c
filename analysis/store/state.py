"""What a store says it was built under: the analyzer version and the expectation rules of its
derived tables (the analyzer_state table). Read by whatever derives or reports, written once an
analysis is done (lifecycle.reanalyze decides when everything derived must be rebuilt)."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from toolproxy.analysis.classify.expectations import ExpectationRule, parse_rules
from toolproxy.analysis.classify.outcomes import ANALYZER_VERSION

_VERSION_KEY = "analyzer_version"
_RULES_KEY = "expect_rules"
_UNFINISHED_KEY = "unfinished_runs"


def _state(con, key: str):
    row = con.execute("SELECT value FROM analyzer_state WHERE key = ?", [key]).fetchone()
    return orjson.loads(row[0]) if row and row[0] is not None else None


def _set_state(con, key: str, value) -> None:
    con.execute("INSERT OR REPLACE INTO analyzer_state VALUES (?, ?)", [key, orjson.dumps(value).decode()])


def stored_rules(con) -> list[ExpectationRule]:
    """The expectation rules the derived tables were built with (none until `analyze --expect`)."""
    return parse_rules(_state(con, _RULES_KEY) or [])


def stored_version(con) -> int | None:
    """The analyzer version the derived tables were built under; None for a new store or one
    analysed before versions were recorded (whose derived tables are therefore out of date)."""
    version = _state(con, _VERSION_KEY)
    return int(version) if version is not None else None


def save_state(con, rules: Sequence[ExpectationRule] | None) -> None:
    _set_state(con, _VERSION_KEY, ANALYZER_VERSION)
    if rules is not None:
        _set_state(con, _RULES_KEY, [str(r) for r in rules])


def unfinished_runs(con) -> list[str]:
    """Runs a derive in steps (episodes.derive) began and did not finish: their turns and
    pointers may be half rebuilt, so the next derive rebuilds them whole."""
    return _state(con, _UNFINISHED_KEY) or []


def set_unfinished_runs(con, runs: Sequence[str]) -> None:
    """None left removes the key, so a store no derive in steps ever stopped in holds the same
    analyzer_state rows as one never derived in steps."""
    if runs:
        _set_state(con, _UNFINISHED_KEY, sorted(set(runs)))
    else:
        con.execute("DELETE FROM analyzer_state WHERE key = ?", [_UNFINISHED_KEY])
