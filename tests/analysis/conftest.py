"""Shared fixtures: a real DuckDB store with every outcome (see storebuilder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from storebuilder import build_store, mixed_runs


@pytest.fixture
def mixed_store(tmp_path: Path) -> Path:
    return build_store(tmp_path / "toolproxy.duckdb", mixed_runs())
