"""The import graph of toolproxy and its analyzer, read from the source (ast), as a table of
(importer, imported, lazy) rows: no import circles between modules (none through a package's
__init__ either) nor between the analyzer's rooms, which import each other in one stated order;
toolproxy's folders import only the layers below their own; the per-record stage imports no other
room, no DuckDB and no NumPy; toolproxy reaches into the analyzer only where the code says why; and
no module takes another's private (underscore) name."""

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
    "toolproxy.live.classify": {
        "toolproxy.analysis.classify.bodies",
        "toolproxy.analysis.classify.record",
        "toolproxy.analysis.measure.runline",
    },
    "toolproxy.live.tally": {"toolproxy.analysis.measure.runline"},
    "toolproxy.live.turns": {
        "toolproxy.analysis.episodes.build",
        "toolproxy.analysis.episodes.model",
        "toolproxy.analysis.episodes.roles",
        "toolproxy.analysis.classify.outcomes",
        "toolproxy.analysis.measure.runline",
    },
    "toolproxy.live.classifier": {"toolproxy.analysis.measure.runline"},
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

# The analyzer's rooms, in the order they may import each other: a room imports only rooms of
# earlier layers, and rooms of one layer import neither way. A room is a folder under analysis/;
# the two modules at its top are rooms of their own, being no stage: options (what the commands of
# every stage share, so under the rooms whose commands import it) and cli (analyze, sql, show).
ANALYSIS_LAYERS = (
    ("classify",),  # one record -> its rows; pure: it runs in analyze's workers and the live page
    ("store",),  # DuckDB; it records which version of classify's rules its derived tables were built under
    ("load",),  # segments -> rows in the store
    ("episodes",),  # attempts -> turns (+ roles) -> episodes
    ("measure",),  # metrics, statistics, a run's summary, compare
    ("options",),
    ("report", "lifecycle"),  # renderers; and what keeps a store true to its segments (ingest, prune, rebuild)
    ("export",),  # Parquet, OTLP, and the Spark job, which ends in the report
    ("cli",),
)
# Modules the per-record stage must never load, even lazily: it runs in every worker process of
# analyze and in the live page's classifier, and a worker that imported these paid ~0.2 s of CPU.
NOT_IN_THE_PER_RECORD_STAGE = ("duckdb", "numpy")


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
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _from_module(package: str, node: ast.ImportFrom) -> str:
    """The module a `from X import ...` in `package` names, relative ones resolved."""
    if not node.level:
        return node.module or ""
    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _imports(name: str, path: Path, faces: list[tuple[str, bool]] | None = None) -> list[tuple[str, bool]]:
    """(module imported, lazily or not) for each import statement in one module; `from X import Y`
    counts as importing X.Y when that is a module, else X. Imports under `if TYPE_CHECKING:` never
    run (names for type hints only), so they are no edge. `faces` is given the packages a
    `from X import Y` with Y a module reads Y from (X's namespace, which X's __init__ fills)."""
    known = modules()
    package = _package(name, path)
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
                base = _from_module(package, child)
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    found.append((full if full in known else base, lazy))
                    if full in known and faces is not None:
                        faces.append((base, lazy))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


@cache
def edges() -> tuple[Edge, ...]:
    prefixes = tuple(f"{p}." for p in SOURCES) + ("analysis.",)
    return tuple(
        Edge(name, imported, lazy)
        for name, path in sorted(modules().items())
        for imported, lazy in _imports(name, path)
        if imported != name and (imported in SOURCES or imported.startswith(prefixes) or imported == "analysis")
    )


@cache
def face_edges() -> tuple[Edge, ...]:
    """A module to each package whose namespace it takes a module from (`from . import m`,
    `from toolproxy.emulators import encoding`): that namespace is the package's public face, filled
    by its __init__, which imports the package's modules."""
    out = []
    for name, path in sorted(modules().items()):
        faces: list[tuple[str, bool]] = []
        _imports(name, path, faces)
        out += [Edge(name, package, lazy) for package, lazy in faces if package != name]
    return tuple(dict.fromkeys(out))


def _graph(*extra: Edge) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for e in (*edges(), *extra):
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
    assert Edge("toolproxy.calls.parse", "toolproxy.calls.mistral", False) in table  # from .mistral import
    assert Edge("toolproxy.drive.replay", "toolproxy.analysis.store.connection", True) in table  # inside a function
    assert Edge("toolproxy.analysis.classify.record", "toolproxy.analysis.classify.keys", False) in table


def test_type_checking_imports_are_no_edge():
    table = set(edges())
    assert Edge("toolproxy.emulators.server", "toolproxy.emulators.base", False) in table
    assert not any(
        e.importer == "toolproxy.emulators.base" and e.imported == "toolproxy.emulators.server" for e in table
    )


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    """Lazy imports count: a circle broken only by importing inside a function is still one."""
    assert circles(_graph()) == []


def _reached(graph: dict[str, set[str]], start: list[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def test_the_per_record_stage_does_not_reach_the_episode_stage():
    seen = _reached(_graph(), ["toolproxy.analysis.classify.record"])
    assert sorted(m for m in seen if m.startswith("toolproxy.analysis.episodes")) == []


def room(module: str) -> str | None:
    """The analyzer's room a module is in (see ANALYSIS_LAYERS); None outside the analyzer, and for
    the package itself (analysis/__init__.py, its docstring)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["toolproxy", "analysis"] and len(parts) > 2 else None


def room_graph(table=None) -> dict[str, set[str]]:
    """Room -> the rooms it imports (lazy imports count), from the module table."""
    graph: dict[str, set[str]] = {r: set() for r in map(room, modules()) if r is not None}
    for e in table if table is not None else edges():
        a, b = room(e.importer), room(e.imported)
        if a is not None and b is not None and a != b:
            graph[a].add(b)
    return graph


def test_room_graph_reads_folders_and_top_modules():
    table = [
        Edge("toolproxy.analysis.load.pipeline", "toolproxy.analysis.store.tables", False),
        Edge("toolproxy.analysis.report.cli", "toolproxy.analysis.options", False),
        Edge("toolproxy.analysis.report.cli", "toolproxy.analysis.report.details", True),
        Edge("toolproxy.drive.run", "toolproxy.analysis.measure.runline", True),
    ]
    graph = room_graph(table)
    assert graph["load"] == {"store"} and graph["report"] == {"options"} and graph["measure"] == set()
    assert "toolproxy" not in graph and None not in graph


def test_the_analyzers_rooms_import_each_other_in_no_circle():
    """A circle of rooms (ingest <-> episodes, say) is one even when no two modules form one."""
    assert circles(room_graph()) == []


def test_every_room_of_the_analyzer_has_its_place_in_the_order():
    placed = [r for layer in ANALYSIS_LAYERS for r in layer]
    assert len(placed) == len(set(placed))
    assert set(placed) == set(room_graph())


def test_each_room_imports_only_rooms_before_it():
    layer = {r: i for i, rooms in enumerate(ANALYSIS_LAYERS) for r in rooms}
    wrong = sorted(
        f"{e.importer} -> {e.imported}{' (lazy)' if e.lazy else ''}"
        for e in edges()
        if room(e.importer) is not None
        and room(e.imported) is not None
        and room(e.importer) != room(e.imported)
        and layer[room(e.importer)] <= layer[room(e.imported)]
    )
    assert wrong == []


def test_the_per_record_stage_imports_no_other_room_nor_duckdb_nor_numpy():
    graph = _graph()
    stage = [m for m in modules() if room(m) == "classify"]
    seen = _reached(graph, stage)
    assert sorted(m for m in seen if room(m) not in (None, "classify")) == []
    heavy = sorted(
        f"{m} imports {imported}"
        for m in seen
        for imported, _ in _imports(m, modules()[m])
        if imported.split(".")[0] in NOT_IN_THE_PER_RECORD_STAGE
    )
    assert heavy == []


def test_toolproxy_imports_the_analyzer_only_where_it_says_why():
    found: dict[str, set[str]] = {}
    for e in edges():
        if (
            e.importer.startswith("toolproxy.")
            and not e.importer.startswith("toolproxy.analysis")
            and e.imported.startswith("toolproxy.analysis")
        ):
            found.setdefault(e.importer, set()).add(e.imported)
    assert found == INTO_ANALYSIS


def test_nothing_installed_imports_the_checkout_only_names():
    """`analysis` (the folder, installed as toolproxy.analysis) and `benchmarks` (never installed)
    import only from a checkout: an installed module that named them would fail."""
    wrong = [
        e
        for e in edges()
        if not e.importer.startswith("benchmarks")
        and (e.imported == "analysis" or e.imported.startswith(("analysis.", "benchmarks")))
    ]
    assert wrong == []


# toolproxy's folders from the bottom up: a folder imports only from folders in layers below its
# own, never from one beside it or above it (lazy imports count). The package root (`toolproxy`:
# __version__) is below all of them.
TOOLPROXY_LAYERS = (
    # Leaves, needing nothing of toolproxy: how any toolproxy process runs (its GC, event loop and
    # helper processes), what a terminal is shown, and the one model of every protocol.
    ("runtime", "term", "wire"),
    # On the wire: tool calls written as text (parsed by the conditions live and by the analyzer
    # afterwards) and the Record, the contract between the wire and the disk.
    ("calls", "record"),
    # What knows requests and records but not the proxy: the serving stacks as data, the
    # conditions' rewrites, and the two record listeners the proxy hangs on its recorded hook
    # (the OTLP shipper, the live page), so either can be tested, or run, without a proxy.
    ("stacks", "conditions", "otlp", "live"),
    # The proxy assembles all of them (proxy/addons.py).
    ("proxy",),
    # The emulated stacks: upstreams built from the stacks' data and the wire, which log a request
    # their HTTP parser refuses through serve's own filter (proxy/serverlog.py), never a traceback.
    ("emulators",),
    # What starts a proxy for a purpose: doctor and conformance, recordings served back, the
    # builders the tests use (which start emulators too).
    ("checks", "playback", "testing"),
    # MCP servers' traffic: the stdio relay and its records, and stdio playback (playback's matching).
    ("mcp",),
    # What drives a harness through a proxy, against a stack, an emulator or a playback.
    ("drive",),
    # The command line, which reaches every command by name.
    ("cli",),
)


def test_no_circle_through_a_package_face():
    """A package's modules take their siblings as modules (`import toolproxy.wire.framing as
    framing`, `from .framing import DONE`), never from the package's namespace (`from . import
    framing`, `from toolproxy.emulators import encoding`): its __init__ fills that namespace by
    importing them, so such an import runs in a circle through the __init__."""
    assert circles(_graph(*face_edges())) == []


def test_face_edges_are_found():
    faces = set(face_edges())
    assert (
        Edge("toolproxy.stacks.fingerprint", "toolproxy.stacks", False) in faces
    )  # from toolproxy.stacks import markers
    assert Edge("toolproxy.proxy.forward", "toolproxy", False) in faces  # from toolproxy import wire: no circle
    assert (
        Edge("toolproxy.emulators.base", "toolproxy.emulators", False) not in faces
    )  # import ....encoding as encoding


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(name: str, path: Path) -> list[tuple[str, str, str]]:
    """(importer, module, name) for each underscore name one module takes from another of the
    product: `from M import _x`, and `M._x` where M is a module it imported (under any name).
    Dunder names are Python's own, not private."""
    known = modules()
    package = _package(name, path)
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}  # local name -> the module it is
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = _from_module(package, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif _private(alias.name) and base in known and base != name:
                    found.append((name, base, alias.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain = _dotted(node.value)
            if chain is not None and chain[0] in bound:
                module = ".".join([bound[chain[0]], *chain[1:]])
                if module in known and module != name:
                    found.append((name, module, node.attr))
    return found


def test_private_imports_are_found(tmp_path):
    case = tmp_path / "case.py"
    case.write_text(
        "from toolproxy.wire import model as m\nimport toolproxy.wire.framing\nimport toolproxy.calls.parse as p\n"
        "from toolproxy.calls.model import _private\n"
        "m._hidden; toolproxy.wire.framing._also; p._third; m.__name__; m.shown; self._own\n"
    )
    assert sorted(private_imports("toolproxy.case", case)) == [
        ("toolproxy.case", "toolproxy.calls.model", "_private"),
        ("toolproxy.case", "toolproxy.calls.parse", "_third"),
        ("toolproxy.case", "toolproxy.wire.framing", "_also"),
        ("toolproxy.case", "toolproxy.wire.model", "_hidden"),
    ]


def test_no_private_name_is_imported_across_modules():
    """An underscore name is its module's own: another module that needs it needs it public,
    under a name that says what it is."""
    found = {
        hit for name, path in modules().items() if name.startswith("toolproxy") for hit in private_imports(name, path)
    }
    assert sorted(found) == []


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "toolproxy" and len(parts) > 1 and parts[1] != "analysis" else None


def test_every_toolproxy_folder_has_a_layer():
    assert {f for f in map(_folder, modules()) if f} == {f for layer in TOOLPROXY_LAYERS for f in layer}


def test_toolproxy_folders_import_only_the_layers_below_their_own():
    rank = {folder: i for i, layer in enumerate(TOOLPROXY_LAYERS) for folder in layer}
    wrong = [
        e
        for e in edges()
        if _folder(e.importer)
        and _folder(e.imported)
        and _folder(e.importer) != _folder(e.imported)
        and rank[_folder(e.imported)] >= rank[_folder(e.importer)]
    ]
    assert wrong == []
