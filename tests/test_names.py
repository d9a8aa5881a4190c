"""One name per concept (docs/architecture.md#glossary-one-word-per-concept): no two classes in
the installed code share a name, so a traceback, a docstring or a grep names one thing."""

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def class_homes() -> dict[str, list[str]]:
    homes: dict[str, list[str]] = collections.defaultdict(list)
    for tree in ("toolproxy", "analysis"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    homes[node.name].append(str(path.relative_to(ROOT)))
    return homes


def test_no_two_classes_share_a_name():
    shared = {name: paths for name, paths in class_homes().items() if len(paths) > 1}
    assert shared == {}


def test_the_scan_sees_the_classes_it_guards():
    homes = class_homes()
    assert homes["Record"] == ["toolproxy/record/model.py"]
    assert len(homes) > 100
