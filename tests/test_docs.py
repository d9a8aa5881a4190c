"""The manual stays true: docs/ builds with every link and anchor resolving, README stays a front
door, and every page, anchor, module and command the code, the docs and README name exists.

References to the manual are written in one greppable form, a docs/ page path with an optional
#anchor, so this module finds them all and checks each against the built site: a page renamed or
a heading reworded fails here, not in a reader's browser."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_LIMIT = 12 * 1024
# Trees whose files may point into the manual.
CODE_TREES = ("toolproxy", "analysis", "tests", "examples", "deploy")
DOC_REF = re.compile(r"docs/([A-Za-z0-9_./-]+\.md)(?:#([A-Za-z0-9_-]+))?")
# Names of files that never existed in this repository and must not be cited (split so that this
# file does not cite them either).
FORBIDDEN = ("STACKS" + ".md", "SPEC" + ".md", "../" + "shared")


def site(tmp: Path) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    return proc, out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    proc, out = site(tmp_path_factory.mktemp("docs"))
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.fixture(scope="module")
def anchors(built) -> dict[str, set[str]]:
    """Each page's path under docs/ -> the ids of its headings, as built."""
    pages = {}
    for md in DOCS.rglob("*.md"):
        rel = md.relative_to(DOCS)
        html = built / rel.parent / ("index.html" if rel.name == "index.md" else f"{rel.stem}/index.html")
        if html.exists():
            pages[rel.as_posix()] = set(re.findall(r'<h[1-6][^>]*\sid="([^"]+)"', html.read_text()))
    return pages


def broken(refs, anchors) -> list[str]:
    return [
        f"{where}: docs/{page}{'#' + anchor if anchor else ''}"
        for where, page, anchor in refs
        if page not in anchors or (anchor and anchor not in anchors[page])
    ]


def test_mkdocs_build_strict_passes(built):
    assert (built / "index.html").exists()
    assert (built / "recipes" / "index.html").exists()


def test_a_broken_anchor_fails_the_strict_build(tmp_path):
    """The configuration itself: a link to a heading that does not exist must stop the build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[there](other.md#no-such-heading)\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    config = (ROOT / "mkdocs.yml").read_text()
    config = config.split("\nnav:")[0] + "\nnav:\n  - index.md\n  - other.md\n"
    (tmp_path / "mkdocs.yml").write_text(config)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode != 0
    assert "no-such-heading" in proc.stdout + proc.stderr


def test_readme_is_a_front_door():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size:,} bytes; the front door holds at most {README_LIMIT:,}"


def test_readme_keeps_its_two_commands():
    """.ci/run runs README's test command verbatim, and the demo test runs its first."""
    text = README.read_text()
    section = text.split("## Two commands\n", 1)[1].split("\n## ", 1)[0]
    assert "```\npython3 -m venv .venv && . .venv/bin/activate && pip install -e . && toolproxy demo\n```" in section
    tests = re.search(
        r"```\n(python3 -m venv \.venv && \. \.venv/bin/activate && pip install -e '\.\[test\]' && pytest[^\n]*)\n```",
        section,
    )
    assert tests, "README's second command makes and activates its venv, installs the test extra and runs pytest"
    assert tests.group(1) + "\n" in (ROOT / ".ci" / "run").read_text()


def test_readme_s_second_command_stands_alone_in_a_fresh_shell(tmp_path):
    """It began with `pip install`, so in a fresh shell (no venv active: the first command's
    activation does not outlive its shell) it installed into the system Python. Whatever it runs
    before its `pip install` must leave this shell in a virtualenv of its own."""
    section = README.read_text().split("## Two commands\n", 1)[1].split("\n## ", 1)[0]
    command = re.findall(r"```\n([^\n]*pytest[^\n]*)\n```", section)[0]
    setup = command.split("pip install", 1)[0].rstrip().removesuffix("&&").strip()
    assert setup, f"README's second command installs before it makes or activates a venv: {command}"
    probe = "python -c 'import sys; print(sys.prefix != sys.base_prefix, sys.prefix)'"
    path = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if not (Path(d) / "activate").exists()
    )
    fresh = {"PATH": path, "HOME": str(tmp_path)}  # a new login's shell: no VIRTUAL_ENV, no venv on PATH
    done = subprocess.run(
        ["bash", "-c", f"{setup} && {probe}"], cwd=tmp_path, env=fresh, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    inside, prefix = done.stdout.split()
    assert inside == "True" and Path(prefix).resolve().is_relative_to(tmp_path.resolve()), done.stdout


def test_readme_links_into_docs_resolve(anchors):
    refs = [
        ("README.md", m.group(1), m.group(2))
        for m in re.finditer(r"\]\(" + DOC_REF.pattern + r"\)", README.read_text())
    ]
    assert len(refs) >= 10, "README links into docs/ for everything it leaves out"
    assert not broken(refs, anchors)


def code_texts():
    """(path under the root, text) of every text file in CODE_TREES."""
    for tree in CODE_TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            # traffic captured from real agents (segments, an agent's own record, WebSocket frames) quotes
            # their own prompts (Codex names a skill file): not code
            captured = {"segments", "agent", "websocket"}
            if path.is_file() and "__pycache__" not in path.parts and not captured & set(path.parts):
                try:
                    yield path.relative_to(ROOT).as_posix(), path.read_text()
                except UnicodeDecodeError:
                    continue


def test_doc_references_in_code_point_at_pages_and_anchors(anchors):
    refs = [(where, m.group(1), m.group(2)) for where, text in code_texts() for m in DOC_REF.finditer(text)]
    assert len(refs) >= 15, f"found only {len(refs)} docs/ references in {', '.join(CODE_TREES)}"
    assert not broken(refs, anchors), "references to pages or anchors that do not exist"


def test_code_cites_no_readme_section_and_no_missing_file():
    stale = [where for where, text in code_texts() if re.search(r"README(?::|'s) \"", text)]
    assert not stale, "cite the page instead: its path under docs/ and #anchor"


def test_no_file_names_what_never_existed_here():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    hits = []
    for name in files.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        hits += [f"{name}: {word}" for word in FORBIDDEN if word.encode() in data]
    assert not hits


def quoted_code(text: str) -> list[str]:
    """Every fenced code line and inline code span of a Markdown text."""
    out, fence, prose = [], False, []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif fence:
            out.append(line)
        else:
            prose.append(line)
    out += re.findall(r"`([^`\n]+)`", "\n".join(prose))
    return out


def manual_texts() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in [README, *sorted(DOCS.rglob("*.md"))]]


COMMAND = re.compile(r"(?<![\w/.:-])toolproxy ([a-z][a-z-]*)([^#|]*)")
PYTHON_M = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
PYTHON_FILE = re.compile(r"\bpython3? ((?:[\w.-]+/)*[\w.-]+\.py)\b")


@functools.cache
def help_text(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "toolproxy.cli", *args, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    return proc.stdout if proc.returncode == 0 else ""


def subcommands() -> set[str]:
    listing = help_text().split("Commands:", 1)[1]
    return {line.split()[0] for line in listing.splitlines() if line.startswith("  ") and line.split()}


def test_toolproxy_commands_quoted_in_the_manual_exist():
    known = subcommands()
    assert {"serve", "analyze", "report", "run"} <= known
    missing, checked = [], 0
    for where, text in manual_texts():
        for code in quoted_code(text):
            for m in COMMAND.finditer(code):
                sub, rest = m.group(1), re.split(r" -- |&&|;", m.group(2))[0]
                if sub not in known:
                    missing.append(f"{where}: toolproxy {sub}")
                    continue
                checked += 1
                options = help_text(sub)
                missing += [
                    f"{where}: toolproxy {sub} {flag}"
                    for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)
                    if not re.search(rf"(?<![\w-]){flag}(?![\w-])", options)
                ]
    assert checked >= 50
    assert not missing, "commands or flags the CLI does not have"


def test_python_modules_and_scripts_quoted_in_the_manual_exist():
    sys.path.insert(0, str(ROOT))
    try:
        missing, checked = [], 0
        for where, text in manual_texts():
            for code in quoted_code(text):
                for module in PYTHON_M.findall(code):
                    checked += 1
                    try:
                        found = importlib.util.find_spec(module) is not None
                    except ModuleNotFoundError:
                        found = False
                    if not found and not (ROOT / (module.replace(".", "/") + ".py")).exists():
                        missing.append(f"{where}: python -m {module}")
                for script in PYTHON_FILE.findall(code):
                    checked += 1
                    if not (ROOT / script).exists():
                        missing.append(f"{where}: python {script}")
    finally:
        sys.path.remove(str(ROOT))
    assert checked >= 10
    assert not missing, "modules or scripts that do not exist"
