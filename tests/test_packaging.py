"""Packaging: every package folder is listed in pyproject.toml, and the analyzer installs as
toolproxy.analysis (a generic top-level `analysis` package must never reach site-packages)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _folders() -> set[str]:
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "toolproxy").rglob("__init__.py")}
    found |= {
        "toolproxy." + ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "analysis").rglob("__init__.py")
    }
    return found


def test_every_package_folder_is_listed():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(setuptools["packages"]) == _folders()
    assert setuptools["package-dir"]["toolproxy.analysis"] == "analysis"
    assert not any(p == "analysis" or p.startswith("analysis.") for p in setuptools["packages"])
    assert not any(p == "benchmarks" or p.startswith("benchmarks.") for p in setuptools["packages"])


def test_the_analyzer_imports_under_toolproxy():
    import toolproxy.analysis.cli as cli

    assert Path(cli.__file__).resolve().parent == ROOT / "analysis"


def test_the_license_is_an_spdx_expression_the_backend_reads():
    """PEP 639: `license = {text = ...}` is deprecated in setuptools and refused from 2027-02-18;
    the SPDX string needs setuptools 77.0.3 or newer to build."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert doc["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77.0.3" in doc["build-system"]["requires"]
    assert not any(c.startswith("License ::") for c in doc["project"].get("classifiers", []))  # both is an error
