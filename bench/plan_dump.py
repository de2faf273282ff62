"""Write what `recipeforge plan` (and `validate`) print for every example recipe, one file per case.

    python bench/plan_dump.py OUT            # writes OUT/<case>.txt
    diff -r BEFORE/ AFTER/                   # an empty diff: the planner's output did not change

A golden for refactorings that must not change what the planner decides or how it says it: run it
before and after a change (from the repository root, with the checkout on `PYTHONPATH`) and compare
the two folders. Every case runs `recipeforge.cli.main` in this process (a few seconds for the whole
matrix), and each file holds the command line, the exit code, stdout and stderr, so a recipe that
fails to plan is compared by its error text too.

The matrix: every recipe under `examples/` and `tests/data/` (base recipes and deliberately broken
ones included) × `plan --json`, `plan` (text), `validate`, `plan --json --hardware H` for a handful of
single-GPU, single-node and multi-node targets, a CPU spread over two processes and a two-node plan;
`plan --json` again with the ways of trusting remote code; and `bench/plan_cases.py --json`.
Recipe paths are written relative to the repository root, so two checkouts give comparable dumps.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Targets that exercise each planner path: CPU, one small and one large GPU, one node of several
# GPUs, consumer cards, and two nodes (the multi-node layouts).
HARDWARE = ("cpu", "1xL4-24GB", "1xH100-80GB", "4xA100-40GB", "2xRTX4090-24GB", "8xH100-80GB",
            "2x8xH100-80GB")

# `plan --json` under each way remote code can be trusted (a flag or the environment variable).
TRUST = (
    ("trust-none", [], {}),
    ("trust-flag", ["--trust-code"], {}),
    ("trust-env-1", [], {"RECIPEFORGE_TRUST_CODE": "1"}),
    ("trust-env-true", [], {"RECIPEFORGE_TRUST_CODE": "true"}),
)


def recipes(root: Path = ROOT) -> list[str]:
    """Every YAML recipe under examples/ and tests/data/, relative to `root`, in a stable order."""
    found = [*root.glob("examples/**/*.yaml"), *root.glob("tests/data/**/*.yaml")]
    return sorted(str(p.relative_to(root)) for p in found)


def stem_of(recipe: str) -> str:
    """A file-name-safe prefix for a recipe's cases."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", recipe)


def cases(recipe: str, valid: bool) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """(case name, CLI arguments, extra environment) for one recipe of the matrix.

    A recipe that does not validate (a base recipe, another tool's config, a broken fixture) gets
    the plain `plan` cases only: the other targets would repeat the same error text.
    """
    stem = stem_of(recipe)
    yield f"{stem}__plan-json", ["plan", recipe, "--json"], {}
    yield f"{stem}__plan-text", ["plan", recipe], {}
    if not valid:
        return
    for hw in HARDWARE:
        yield f"{stem}__plan-json__{hw}", ["plan", recipe, "--json", "--hardware", hw], {}
    yield f"{stem}__plan-text__2x8xH100-80GB", ["plan", recipe, "--hardware", "2x8xH100-80GB"], {}
    yield f"{stem}__plan-json__nproc2", ["plan", recipe, "--json", "--nproc-per-node", "2"], {}
    yield (f"{stem}__plan-json__nnodes2",
           ["plan", recipe, "--json", "--nnodes", "2", "--hardware", "2x8xH100-80GB"], {})
    for label, flags, env in TRUST:
        yield f"{stem}__plan-json__{label}", [*flags, "plan", recipe, "--json"], env


@contextlib.contextmanager
def _isolated(env: dict[str, str]) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Capture stdout/stderr, and restore the environment afterwards: the CLI writes variables
    (--trust-code, --verbose) that would otherwise leak into the next case."""
    saved = dict(os.environ)
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_cli(args: list[str], env: dict[str, str]) -> str:
    """One case's record: the command line, its exit code, stdout and stderr."""
    from recipeforge.cli import main

    with _isolated(env) as (out, err):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse errors and --help
            code = exc.code if isinstance(exc.code, int) else 2
    env_text = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    return (f"$ {env_text + ' ' if env_text else ''}recipeforge {' '.join(args)}\n"
            f"exit {code}\n--- stdout\n{out.getvalue()}--- stderr\n{err.getvalue()}")


def run_plan_cases() -> str:
    """`bench/plan_cases.py --json`: the planner on the realistic grid of model × hardware cases."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import plan_cases
    finally:
        sys.path.pop(0)
    with _isolated({}) as (out, err):
        code = plan_cases.main(["--json"])
    # --json has no timing column (the table's `ms` would differ run to run).
    return (f"$ python bench/plan_cases.py --json\nexit {code}\n--- stdout\n{out.getvalue()}"
            f"--- stderr\n{err.getvalue()}")


def dump(out_dir: Path) -> int:
    """Write every case of the matrix to `out_dir`; returns the number of files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # recipe paths in the output are relative to the repository root
    written = 0
    for recipe in recipes():
        checked = run_cli(["validate", recipe], {})
        (out_dir / f"{stem_of(recipe)}__validate.txt").write_text(checked, encoding="utf-8")
        written += 1
        for name, args, env in cases(recipe, valid=checked.splitlines()[1] == "exit 0"):
            (out_dir / f"{name}.txt").write_text(run_cli(args, env), encoding="utf-8")
            written += 1
    (out_dir / "bench_plan_cases.txt").write_text(run_plan_cases(), encoding="utf-8")
    return written + 1


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `plan_dump.py OUT`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write one file per case into")
    args = parser.parse_args(argv)
    count = dump(args.out.resolve())
    print(f"{count} cases written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
