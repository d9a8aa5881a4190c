"""docs/architecture.md against the tree it draws: every package of toolproxy and of the analyzer
has its entry in the package tree, naming every module in it (and no entry names a folder that is
gone), and the addon order it lists is the order toolproxy/proxy/addons.py builds."""

from __future__ import annotations

import re
from pathlib import Path

from toolproxy.proxy import app as proxy_app
from toolproxy.testing import flows

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
# Files of a package that are no module of its own concept.
NOT_NAMED = {"__init__.py", "__main__.py"}


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else None]


def tree_entries() -> dict[str, str]:
    """Path -> its description, from the fenced block of "The package tree": an entry starts with a
    path at the line's start; indented lines continue the entry above."""
    block = _section("The package tree").split("```")[1]
    entries: dict[str, str] = {}
    path = None
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            path, _, text = line.partition(" ")
            entries[path] = text.strip()
        elif path is not None:
            entries[path] += " " + line.strip()
    return entries


def packages() -> dict[str, Path]:
    """Entry path as the doc writes it -> the package folder."""
    found = {}
    for base in ("toolproxy", "analysis"):
        for init in sorted((ROOT / base).rglob("__init__.py")):
            folder = init.parent
            if folder != ROOT / base:
                found[f"{folder.relative_to(ROOT).as_posix()}/"] = folder
    return found


def test_every_package_has_an_entry_and_no_entry_is_stale():
    entries = tree_entries()
    named_packages = {p for p in entries if p.startswith(("toolproxy/", "analysis/")) and p.endswith("/")}
    assert sorted(set(packages()) - named_packages) == [], "packages missing from docs/architecture.md"
    assert sorted(named_packages - set(packages()) - {"analysis/"}) == [], "entries for folders that are gone"
    files = [p for p in entries if p.endswith(".py")]
    assert [f for f in files if not (ROOT / f).is_file()] == []


def test_each_entry_names_every_module_of_its_package():
    entries = tree_entries()
    missing = []
    for path, folder in packages().items():
        words = set(re.findall(r"[\w.]+", entries.get(path, "")))
        for f in sorted(folder.iterdir()):
            if f.name in NOT_NAMED or f.name == "__pycache__" or f.is_dir():
                continue
            name = f.stem if f.suffix == ".py" else f.name
            if f.suffix in (".py", ".html", ".css", ".json") and name not in words:
                missing.append(f"{path}{f.name}")
    assert missing == [], "modules docs/architecture.md does not name in their package's entry"


def test_the_entries_parse_as_a_map():
    entries = tree_entries()
    assert "toolproxy/proxy/" in entries and "addons" in entries["toolproxy/proxy/"]
    assert entries["analysis/classify/"].strip().startswith("the pure per-record stage")


def documented_addon_order() -> list[str]:
    block = DOC.split("<!-- addon order -->")[1].split("<!-- /addon order -->")[0]
    return re.findall(r"^\d+\. `(\w+)`", block, flags=re.M)


def test_the_addon_order_is_the_one_addons_py_builds(tmp_path):
    state = proxy_app.make_state(
        flows.config(
            data_dir=tmp_path,
            quiet=True,
            mask=("email",),
            retain_seconds=60.0,
            max_disk=10**9,
            on_disk_full="block",
            sample=0.5,
            auth_token="t",
            on_record_failure="block",
            upstream_key="sk",
            otlp_endpoint="http://127.0.0.1:9/v1/traces",
            mcp_server="files",
        )
    )
    assert [type(a).__name__ for a in state.hooks.addons] == documented_addon_order()
