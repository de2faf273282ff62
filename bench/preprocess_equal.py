"""Check that two source trees build the same tokenized-data cache for a recipe, row by row.

Runs `python -m recipeforge preprocess RECIPE` from each tree (e.g. a `git worktree` of an older commit
and this checkout) into fresh cache folders, then compares the two cache entries: statistics, column
types, and every row's input_ids, labels and position_ids. Exit 0 when identical, 1 otherwise.

    git worktree add /tmp/base HEAD
    python bench/preprocess_equal.py --baseline /tmp/base --recipe my.yaml [k=v ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOLATILE = {"preprocess_seconds", "tokens_per_second", "cache", "cache_path"}


def build(tree: Path, recipe: str, overrides: list[str], cache: Path) -> dict:
    """Preprocess `recipe` with the recipeforge of `tree` into `cache`; its statistics."""
    cmd = [sys.executable, "-m", "recipeforge", "preprocess", str(Path(recipe).resolve()), *overrides,
           f"data.cache_dir={cache}"]
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=_env(tree))
    if out.returncode != 0:
        raise SystemExit(f"preprocess failed in {tree}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout[out.stdout.index("{"):])


def _env(tree: Path) -> dict:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)  # this tree's recipeforge, not the installed one
    return env


def compare(a: Path, b: Path) -> list[str]:
    """Differences between two cache entries (empty when identical)."""
    import datasets

    problems = []
    for split in ("train", "eval"):
        if (a / split).exists() != (b / split).exists():
            problems.append(f"{split}: present in one entry only")
            continue
        if not (a / split).exists():
            continue
        da, db = datasets.load_from_disk(str(a / split)), datasets.load_from_disk(str(b / split))
        if da.features != db.features:
            problems.append(f"{split}: features differ: {da.features} vs {db.features}")
        if len(da) != len(db):
            problems.append(f"{split}: {len(da)} rows vs {len(db)}")
            continue
        ta, tb = da.with_format("arrow")[:], db.with_format("arrow")[:]
        for name in da.column_names:
            ca, cb = ta.column(name).combine_chunks(), tb.column(name).combine_chunks()
            if not ca.equals(cb):
                rows = [i for i in range(len(ca)) if ca[i] != cb[i]]
                problems.append(f"{split}.{name}: {len(rows)} rows differ, first at row {rows[0] if rows else '?'}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="source tree of the reference (e.g. a git worktree)")
    ap.add_argument("--candidate", default=str(ROOT), help="source tree to check (default: this checkout)")
    ap.add_argument("--recipe", required=True)
    ap.add_argument("overrides", nargs="*", help="recipe overrides, k=v")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stats = {}
        for name, tree in (("baseline", args.baseline), ("candidate", args.candidate)):
            stats[name] = build(Path(tree), args.recipe, args.overrides, Path(tmp) / name)
        entries = [Path(s["cache_path"]) for s in stats.values()]
        problems = compare(*entries)
        sa, sb = ({k: v for k, v in s.items() if k not in VOLATILE} for s in stats.values())
        if sa != sb:
            problems.append(f"statistics differ: {sa} vs {sb}")
        rows = stats["candidate"].get("packed_sequences") or stats["candidate"].get("train_rows")
        print(json.dumps({"identical": not problems, "train_tokens": sb.get("train_tokens"), "rows": rows,
                          "seconds": {k: s.get("preprocess_seconds") for k, s in stats.items()},
                          "problems": problems}, indent=2))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
