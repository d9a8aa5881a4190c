"""The import graph of toolproxy and its analyzer, read from the source (ast), as a table of
(importer, imported, lazy) rows: no import circles, the per-record stage never reaches the episode
stage, and toolproxy reaches into the analyzer only where the code says why."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
# Where each installed package's source is: the analyzer's folder installs as toolproxy.analysis.
SOURCES = {"toolproxy": ROOT / "toolproxy", "toolproxy.analysis": ROOT / "analysis", "benchmarks": ROOT / "benchmarks"}

# toolproxy modules that import the analyzer, each with what it may import and why. (The CLI's
# commands reach the analyzer through its lazy command table, by name, not by import.)
INTO_ANALYSIS = {
    # The live page classifies each record with the analyzer's own per-record stage and derives
    # its turns with the analyzer's episode code, so the page says what the report will say.
    "toolproxy.proxy.live": {"toolproxy.analysis.classify.bodies", "toolproxy.analysis.classify.record",
                             "toolproxy.analysis.measure.runline"},
    "toolproxy.proxy.liveturns": {"toolproxy.analysis.episodes.build", "toolproxy.analysis.episodes.model",
                                  "toolproxy.analysis.episodes.roles", "toolproxy.analysis.classify.outcomes",
                                  "toolproxy.analysis.measure.runline"},
    "toolproxy.proxy.classifier": {"toolproxy.analysis.measure.runline"},
    # run, study and demo print each run's line as the report reads it (one definition, runline).
    # run also prints each run's provenance lines from the report JSON it fetched, in the words the
    # report itself uses (Provenance.lines), not a second rendering of them.
    "toolproxy.drive.run": {"toolproxy.analysis.measure.runline", "toolproxy.analysis.report.provenance"},
    "toolproxy.drive.study": {"toolproxy.analysis.measure.runline"},
    "toolproxy.drive.demo": {"toolproxy.analysis.measure.runline"},
    # replay reads the recorded requests from a data directory's store.
    "toolproxy.drive.replay": {"toolproxy.analysis.store.connection"},
    # doctor judges a reply by the analyzer's own outcome words and empty-reply causes.
    "toolproxy.checks.doctor": {"toolproxy.analysis.classify.attempt", "toolproxy.analysis.classify.outcomes"},
}


class Edge(NamedTuple):
    importer: str
    imported: str
    lazy: bool  # inside a function: runs when called, not when the module is imported


def _module_name(package: str, base: Path, path: Path) -> str:
    parts = [*package.split("."), *path.relative_to(base).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package, base in SOURCES.items():
        for path in base.rglob("*.py"):
            found[_module_name(package, base, path)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(module imported, lazily or not) for each import statement in one module; `from X import Y`
    counts as importing X.Y when that is a module, else X. Imports under `if TYPE_CHECKING:` never
    run (names for type hints only), so they are no edge."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for other in child.orelse:
                    visit(ast.Module(body=[other], type_ignores=[]), lazy)
                continue
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    found.append((full if full in known else base, lazy))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


@cache
def edges() -> tuple[Edge, ...]:
    prefixes = tuple(f"{p}." for p in SOURCES) + ("analysis.",)
    return tuple(Edge(name, imported, lazy) for name, path in sorted(modules().items())
                 for imported, lazy in _imports(name, path)
                 if imported != name and (imported in SOURCES or imported.startswith(prefixes) or imported == "analysis"))


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for e in edges():
        if e.imported in graph:
            graph[e.importer].add(e.imported)
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_the_table_sees_lazy_and_relative_imports():
    table = set(edges())
    assert Edge("toolproxy.calls.parse", "toolproxy.calls.gcpause", False) in table  # from .gcpause import
    assert Edge("toolproxy.drive.replay", "toolproxy.analysis.store.connection", True) in table  # inside a function
    assert Edge("toolproxy.analysis.classify.record", "toolproxy.analysis.classify.keys", False) in table


def test_type_checking_imports_are_no_edge():
    table = set(edges())
    assert Edge("toolproxy.emulators.server", "toolproxy.emulators.base", False) in table
    assert not any(e.importer == "toolproxy.emulators.base" and e.imported == "toolproxy.emulators.server" for e in table)


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    """Lazy imports count: a circle broken only by importing inside a function is still one."""
    assert circles(_graph()) == []


def test_the_per_record_stage_does_not_reach_the_episode_stage():
    graph = _graph()
    seen, todo = set(), ["toolproxy.analysis.classify.record"]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    assert sorted(m for m in seen if m.startswith("toolproxy.analysis.episodes")) == []


def test_toolproxy_imports_the_analyzer_only_where_it_says_why():
    found: dict[str, set[str]] = {}
    for e in edges():
        if e.importer.startswith("toolproxy.") and not e.importer.startswith("toolproxy.analysis") \
                and e.imported.startswith("toolproxy.analysis"):
            found.setdefault(e.importer, set()).add(e.imported)
    assert found == INTO_ANALYSIS


def test_nothing_installed_imports_the_checkout_only_names():
    """`analysis` (the folder, installed as toolproxy.analysis) and `benchmarks` (never installed)
    import only from a checkout: an installed module that named them would fail."""
    wrong = [e for e in edges() if not e.importer.startswith("benchmarks")
             and (e.imported == "analysis" or e.imported.startswith(("analysis.", "benchmarks")))]
    assert wrong == []
