r"""BFCL (bfcl-eval): its own `generate` and `evaluate` on the first N items of some categories.

    toolproxy run --upstream URL --run bfcl --tag category=simple_python -- \
        python examples/recipes/bfcl.py --first 3 simple_python

BFCL's plain chat-completions function-calling handler (OpenAICompletionsHandler) reads
OPENAI_BASE_URL and OPENAI_API_KEY, which `toolproxy run` sets; in this bfcl-eval release it is
registered only under the model name `openbmb/MiniCPM-SALA-FC`, which is therefore the model name
sent (llama-server ignores it; give --model another BFCL name for another handler, e.g. an
OpenAI `-FC` model for the Responses API). BFCL writes results, scores and the list of items to
generate under BFCL_PROJECT_ROOT (here ./bfcl-project unless set), and loads a .env from there
that would override the environment: this script refuses to start when one exists.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("categories", nargs="+", help="BFCL test categories, e.g. simple_python irrelevance")
parser.add_argument("--first", type=int, default=3, help="items per category (the first N by file order)")
parser.add_argument(
    "--model", default="openbmb/MiniCPM-SALA-FC", help="a BFCL model name (its handler decides the API)"
)
args = parser.parse_args()

root = Path(os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path("bfcl-project").resolve())))
root.mkdir(parents=True, exist_ok=True)
if (root / ".env").exists():
    sys.exit(
        f"{root / '.env'} exists and BFCL would let it override OPENAI_BASE_URL; remove it or set BFCL_PROJECT_ROOT"
    )

from bfcl_eval.constants.category_mapping import VERSION_PREFIX  # noqa: E402  (reads BFCL_PROJECT_ROOT)
from bfcl_eval.constants.eval_config import PROMPT_PATH  # noqa: E402

ids = {}
for category in args.categories:
    with open(PROMPT_PATH / f"{VERSION_PREFIX}_{category}.json") as f:
        ids[category] = [json.loads(line)["id"] for line, _ in zip(f, range(args.first))]
(root / "test_case_ids_to_generate.json").write_text(json.dumps(ids, indent=2))

bfcl = [sys.executable, "-m", "bfcl_eval"]
common = ["--model", args.model, "--test-category", ",".join(args.categories)]
subprocess.run([*bfcl, "generate", *common, "--run-ids", "--num-threads", "1", "--allow-overwrite"], check=True)
subprocess.run([*bfcl, "evaluate", *common, "--partial-eval"], check=True)  # prints each category's accuracy
