"""The commands that turn a finished run into something to ship: merge (a LoRA adapter into its base),
export (a format serving engines load, checked against the unquantized model) and push (to the Hub)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from recipeforge.cli.common import library_warnings_to
from recipeforge.cli.exit_codes import EXIT_CHECK_FAILED
from recipeforge.errors import RecipeError
from recipeforge.log import log

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers


def add_merge(sub: Subparsers) -> None:
    p = sub.add_parser("merge", help="merge a run's LoRA adapter into its base model (safetensors)")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("-o", "--output", help="output directory (default: RUN_DIR/merged)")
    p.set_defaults(func=cmd_merge, cleans_up=True)


def cmd_merge(args: argparse.Namespace) -> int:
    from recipeforge.run import merge

    out = merge(Path(args.run_dir), Path(args.output) if args.output else None)
    print(f"merged model written to {out}")
    return 0


def add_export(sub: Subparsers) -> None:
    # The format names come from the light formats module (no torch): --help stays fast.
    from recipeforge.tools.exporters.formats import FORMAT_SPECS

    p = sub.add_parser("export", help="write a run's model for serving: merged safetensors, torchao int8/int4 or "
                                      "compressed-tensors, checked against the unquantized model",
                       description="Write final/ (a LoRA adapter merged into its base first) in FORMAT, with a "
                                   "README.md saying how to load it and export.json with its self-check: the export "
                                   "is loaded back with transformers and its perplexity on a few held rows (the "
                                   "run's evaluation data, else fixed prompts) must stay within the format's bound "
                                   "of the unquantized model's. Formats: " + "; ".join(
                                       f"{s.name}: {s.summary}" + (" (not written by recipeforge: the error says "
                                                                   "what to run)" if s.elsewhere else "")
                                       for s in FORMAT_SPECS.values()) + ".",
                       epilog="Exit codes: 0 written and checked, 2 bad input (nothing written), 4 written but the "
                              "self-check failed (export.json has the numbers).")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("--format", required=True, metavar="FORMAT",
                   help="one of: " + ", ".join(s.name.value for s in FORMAT_SPECS.values()))
    p.add_argument("-o", "--output", help="output directory (default: RUN_DIR/export-FORMAT)")
    p.add_argument("--overwrite", action="store_true", help="replace an output directory that already holds files")
    p.add_argument("--no-check", action="store_true",
                   help="skip the self-check (loading the export back and comparing it with the unquantized model)")
    p.set_defaults(func=cmd_export, cleans_up=True, pauses_collector=True)


def cmd_export(args: argparse.Namespace) -> int:
    from recipeforge.tools.exporters import export_run

    with library_warnings_to(Path(args.run_dir)):
        result = export_run(Path(args.run_dir), args.format, Path(args.output) if args.output else None,
                            overwrite=args.overwrite, check=not args.no_check, log=log)
    print(f"{args.format} export written to {result.out} in {result.seconds:.1f}s")
    if result.check is None:
        return 0
    print(result.check.line())
    return 0 if result.check.passed else EXIT_CHECK_FAILED


def add_push(sub: Subparsers) -> None:
    p = sub.add_parser("push", help="upload a finished run's model and model card to the Hugging Face Hub",
                       description="Upload final/ (merged/ when the run merged its adapter) and the model card "
                                   "README.md; never checkpoints, optimizer states, logs or the run lock. The "
                                   "repository comes from the run's output.push_to_hub unless --repo-id is given.")
    p.add_argument("run_dir", help="run directory written by `recipeforge train`")
    p.add_argument("--repo-id", help="target repository, e.g. my-org/my-model (default: output.push_to_hub.repo_id)")
    p.add_argument("--public", action="store_true", help="create the repository as public (default: private, "
                                                         "or the run's output.push_to_hub.private)")
    p.add_argument("--dry-run", action="store_true", help="list the files that would be uploaded; upload nothing")
    p.set_defaults(func=cmd_push)


def cmd_push(args: argparse.Namespace) -> int:
    from recipeforge.tools.hub import push, push_plan, repo_from_run

    run_dir = Path(args.run_dir)
    repo_id, private = repo_from_run(run_dir)
    repo_id = args.repo_id or repo_id
    if args.dry_run:
        plan = push_plan(run_dir)
        print("\n".join(f"{dest}\t{src}" for src, dest in plan.files))
        return 0
    if not repo_id:
        raise RecipeError(f"no repository to push {run_dir} to", key="--repo-id",
                          hint="pass --repo-id my-org/my-model (or set output.push_to_hub.repo_id in the recipe)")
    url = push(run_dir, repo_id, private=private and not args.public, log=log)
    print(f"pushed {run_dir} to {url}")
    return 0
