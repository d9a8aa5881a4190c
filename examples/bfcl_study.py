"""BFCL's single-turn categories as `toolproxy study` runs: each category under every condition.

    python examples/bfcl_study.py --upstream http://127.0.0.1:8080 [--first 10] [--data DIR] [--dry-run]

BFCL sends every item through one base URL, so per-item tags are impossible; instead each
category is its own study (`bfcl-CATEGORY`, runs `bfcl-CATEGORY-CONDITION`) tagged
`category=CATEGORY` and with what each item is due: `expect=none` for the irrelevance categories
(no offered function fits, so the right move is not to call: scored by restraint, not fidelity)
and `expect=call` for every other one, so a prose reply where a call was due counts as a miss
rather than as an open question. Items
pair across conditions by content (the analyzer's item key), so each study's McNemar test is
paired per item. A study that is interrupted resumes when this script is run again. When every
category is done, each condition is compared with the first over all categories at once
(`toolproxy compare 'bfcl-*-native' 'bfcl-*-text' --by category`): one pooled McNemar test and a
Holm-adjusted row per category, written to DATA/studies/bfcl.md.

bfcl-eval runs from the cached environment of the recipe checks (examples/recipes/harnesses.py;
built on first use) unless --python names another interpreter with bfcl-eval installed. BFCL's
own results and scores go to DATA/bfcl/CATEGORY (overwritten by each condition; its accuracy is
printed as each run ends). At the end each study's markdown is in DATA/studies/bfcl-CATEGORY.md.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SINGLE_TURN = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
)
NO_CALL_DUE = ("irrelevance", "live_irrelevance")


def commands(args: argparse.Namespace, python: str) -> list[tuple[list[str], dict[str, str]]]:
    """One `toolproxy study` per category, with the environment BFCL needs for it."""
    out = []
    for category in args.categories:
        expect = "none" if category in NO_CALL_DUE else "call"
        tags = ["--tag", f"category={category}", "--tag", f"expect={expect}"]
        argv = [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "study",
            "--upstream",
            args.upstream,
            "--data",
            str(args.data),
            "--name",
            f"bfcl-{category}",
            "--conditions",
            args.conditions,
            *tags,
            "--",
            python,
            str(HERE / "recipes" / "bfcl.py"),
            "--first",
            str(args.first),
            category,
        ]
        out.append((argv, {"BFCL_PROJECT_ROOT": str((args.data / "bfcl" / category).resolve())}))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the model server's root, as for toolproxy serve")
    parser.add_argument("--first", type=int, default=10, help="items per category")
    parser.add_argument(
        "--categories",
        type=lambda s: s.split(","),
        default=list(SINGLE_TURN),
        help="comma-separated BFCL categories (default: every single-turn one)",
    )
    parser.add_argument("--conditions", default="native,hint,text,constrained")
    parser.add_argument("--data", type=Path, default=Path("toolproxy-data"))
    parser.add_argument("--python", help="an interpreter with bfcl-eval (default: the recipes' cached environment)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = parser.parse_args()
    unknown = [c for c in args.categories if c not in SINGLE_TURN]
    if unknown:
        parser.error(f"not a single-turn BFCL category: {', '.join(unknown)}")
    python = args.python
    if python is None and not args.dry_run:
        sys.path.insert(0, str(HERE / "recipes"))
        from harnesses import environment

        python = str(environment("bfcl-eval") / "bin" / "python")
    for argv, env in commands(args, python or "PYTHON"):
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(argv), flush=True)
        if not args.dry_run:
            returncode = study_until_done(argv, env)
            if returncode:  # interrupted (130) or the study could not go on: stop, rerunning resumes
                return returncode
    if not args.dry_run:
        pooled(args)
    return 0


def study_until_done(argv: list[str], env: dict[str, str]) -> int:
    """Run one study; on Ctrl-C let it finish saving its state instead of killing it mid-write.

    A Ctrl-C at a terminal reaches the study too (same process group); a SIGINT sent to this
    script alone is passed on. Either way the study keeps its finished runs and exits.
    """
    child = subprocess.Popen(argv, env={**os.environ, **env})
    try:
        return child.wait()
    except KeyboardInterrupt:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)
            child.wait()
        print("interrupted: run this again to resume", file=sys.stderr)
        return 130


def pooled(args: argparse.Namespace) -> None:
    """Every later condition against the first, pooled over the categories run, into DATA/studies/bfcl.md."""
    conditions = args.conditions.split(",")
    parts = [f"# BFCL, {len(args.categories)} categories x first {args.first} items, pooled per condition\n"]
    for condition in conditions[1:]:
        argv = [
            sys.executable,
            "-m",
            "toolproxy.cli",
            "compare",
            "--data",
            str(args.data),
            "--by",
            "category",
            "--format",
            "markdown",
            f"bfcl-*-{conditions[0]}",
            f"bfcl-*-{condition}",
        ]
        done = subprocess.run(argv, capture_output=True, text=True)
        command = f"`toolproxy compare --by category 'bfcl-*-{conditions[0]}' 'bfcl-*-{condition}'`"
        # compare's markdown carries its own heading; a failed one gets ours, with its message
        result = done.stdout if done.returncode == 0 else f"## {conditions[0]} vs {condition}\n\n{done.stderr}"
        parts.append(f"{result}\n{command}\n")
    out = args.data / "studies" / "bfcl.md"
    out.write_text("\n".join(parts))
    print(f"pooled comparisons: {out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
