"""The commands that prepare and run training: train (here, or as a launched worker), preprocess and
convert-checkpoint; with the training result as a user reads it and the command that resumes a stopped run."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.cli.common import load, recipe_args, worker_flags
from recipeforge.cli.exit_codes import EXIT_INTERNAL_ERROR, EXIT_PUSH_FAILED
from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers
    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.run import LaunchOptions


def add_train(sub: Subparsers) -> None:
    p = sub.add_parser("train", help="plan and run a recipe; writes the run directory",
                       description="Plan the recipe, then train in this process or start the backend's launcher "
                                   "(accelerate launch / torchrun) with the plan's process count, each process "
                                   "running the worker entry on the run's worker.json. Under `accelerate launch -m "
                                   "recipeforge train` or `torchrun -m ...`, rank 0 writes that spec for every rank.",
                       epilog="SIGTERM, SIGUSR1 or a first Ctrl-C: every process finishes its step, a checkpoint "
                              "is saved, and train exits with 75; the same command resumes. A second Ctrl-C "
                              "aborts (exit 130). One run per output.dir: a second train into a directory in "
                              "use exits with 2.")
    recipe_args(p)
    p.add_argument("--overwrite", action="store_true",
                   help="delete what the run directory holds (another run, or a finished one) and start over")
    p.add_argument("--force", action="store_true",
                   help="continue an earlier run of this directory although the recipe changed (the refusal "
                        "without it lists the changes)")
    launch_args(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the launch command, its environment and the generated files; start nothing")
    p.add_argument("--strict", action="store_true",
                   help="a locked recipe: refuse (exit 2) when package versions, the model revision, data or "
                        "hardware differ from its `lock:` (without it: a warning per difference)")
    p.set_defaults(func=cmd_train, pauses_collector=True)


def launch_args(p: argparse.ArgumentParser) -> None:
    """The process layout of `train`: processes per node, nodes, this node's rank, the rendezvous."""
    g = p.add_argument_group("processes and nodes (multi-node: one `recipeforge train` per node; "
                             "under Slurm they are read from its environment)")
    g.add_argument("--nproc-per-node", type=int,
                   help="processes per node: CPU runs (gloo) need it for more than one; GPU runs default to "
                        "one per GPU of the plan")
    g.add_argument("--nnodes", type=int, help="nodes in the job")
    g.add_argument("--node-rank", type=int, help="this node's rank, 0 on the main node")
    g.add_argument("--master-addr", help="hostname or IP of the main node")
    g.add_argument("--master-port", type=int, help="rendezvous port on the main node (default 29500)")


def cmd_train(args: argparse.Namespace) -> int:
    from recipeforge.run import LaunchOptions

    loaded = load(args)
    opts = LaunchOptions(recipe_path=args.recipe, overrides=tuple(args.overrides),
                         nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                         master_addr=args.master_addr, master_port=args.master_port, dry_run=args.dry_run,
                         strict=args.strict, **worker_flags(args))
    return run_training(args, loaded, opts)


def run_training(args: argparse.Namespace, loaded: LoadedRecipe, opts: LaunchOptions) -> int:
    """Train `loaded` as `opts` (a `LaunchOptions`) says (`train`, `launch --ray`) and report the result."""
    from recipeforge.run import LaunchFailed, summary, train
    from recipeforge.stages.base import DistInfo
    from recipeforge.stages.preemption import EXIT_PREEMPTED, Preempted
    from recipeforge.tools.hub import PushFailed

    try:
        run_dir = train(loaded, overwrite=args.overwrite, force=args.force, launch=opts)
    except LaunchFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code if exc.code > 0 else EXIT_INTERNAL_ERROR
    except PushFailed as exc:  # trained and saved; only the upload failed (its hint says how to retry)
        from recipeforge.config.secrets import scrub

        print(f"error: {scrub(exc.render())}", file=sys.stderr)
        return EXIT_PUSH_FAILED
    except Preempted as stop:
        if DistInfo.from_env().is_main:
            from recipeforge.config.secrets import scrub

            again = resume_command(args)
            shown = scrub(again)
            note = "" if shown == again else " (with the credentials you gave in place of <redacted>)"
            print(f"[recipeforge] {stop.describe()}\n[recipeforge] to continue, run the same command again "
                  f"(it resumes from the newest checkpoint){note}: {shown}", file=sys.stderr)
        return EXIT_PREEMPTED
    if run_dir is None:  # --dry-run printed the launch
        return 0
    if not DistInfo.from_env().is_main:
        return 0  # a rank of a group launched on `recipeforge train` itself: rank 0 reports
    learned = ", ".join(f"{k} {v['first']:.4g} -> {v['last']:.4g}" for k, v in summary(run_dir).items())
    print(f"run written to {run_dir}" + (f" ({learned})" if learned else ""))
    return 0


def resume_command(args: argparse.Namespace) -> str:
    """The command that continues a stopped `train` (or `launch --ray`): the same recipe, overrides and
    every flag the run depends on (the code opt-in, the process layout, --strict, the Ray cluster), and
    never --overwrite (it would delete the checkpoint to resume from) or --dry-run."""
    argv = ["recipeforge", *(["--trust-code"] if args.trust_code else [])]
    valued: tuple[tuple[str, Any], ...]
    if getattr(args, "ray", False):
        argv += ["launch", "--ray", args.recipe, *args.overrides]
        valued = (("--ray-address", args.ray_address), ("--nproc-per-node", args.nproc_per_node))
    else:
        argv += ["train", args.recipe, *args.overrides]
        valued = (("--nproc-per-node", args.nproc_per_node), ("--nnodes", args.nnodes), ("--node-rank", args.node_rank),
                  ("--master-addr", args.master_addr), ("--master-port", args.master_port))
        if args.strict:
            argv.append("--strict")
    for flag, value in valued:
        if value is not None:
            argv += [flag, str(value)]
    return shlex.join(argv)


def add_preprocess(sub: Subparsers) -> None:
    p = sub.add_parser("preprocess", help="tokenize and cache a recipe's datasets ahead of training")
    recipe_args(p)
    p.set_defaults(func=cmd_preprocess, owns_process=True)


def cmd_preprocess(args: argparse.Namespace) -> int:
    from recipeforge import start_up
    from recipeforge.run import preprocess

    loaded = load(args)
    start_up.resume(*start_up.TOKENIZING)
    stats = preprocess(loaded)
    print(json.dumps(stats, indent=2, default=str))
    return 0


def add_convert_checkpoint(sub: Subparsers) -> None:
    p = sub.add_parser("convert-checkpoint",
                       help="convert a recipe's Hugging Face model to a Megatron checkpoint (cached; megatron "
                            "backend), or into -o DIR at any tensor-parallel size, or a Megatron checkpoint back "
                            "to Hugging Face safetensors (--to-hf)")
    recipe_args(p)
    p.add_argument("-o", "--output", help="write here instead of the cache: DIR/megatron/ckpt (and DIR/base_model "
                                          "for a tiny: model), or with --to-hf the safetensors")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="convert in N processes (gloo on the CPU), each holding 1/N of the split weights "
                        "(needs -o; default 1)")
    p.add_argument("--to-hf", metavar="CHECKPOINT",
                   help="export this Megatron checkpoint (a ckpt folder, or a run's checkpoints folder) of the "
                        "recipe's model to Hugging Face safetensors in -o DIR")
    p.set_defaults(func=cmd_convert_checkpoint)


def cmd_convert_checkpoint(args: argparse.Namespace) -> int:
    if args.tensor_parallel < 1:
        raise RecipeError(f"--tensor-parallel must be 1 or more (got {args.tensor_parallel})")
    if args.output is None and (args.to_hf or args.tensor_parallel != 1):
        raise RecipeError("--to-hf and --tensor-parallel write into a folder of your choice: add -o DIR",
                          hint="without -o the model is converted at tensor parallel 1 into the cache")
    recipe = load(args).recipe
    from recipeforge.backends import megatron_convert as convert

    if args.to_hf:
        out = convert.convert_to_hf(recipe, Path(args.to_hf), Path(args.output), tensor_parallel=args.tensor_parallel)
        print(f"Hugging Face checkpoint: {out}")
    elif args.output:
        out = convert.convert_to_megatron(recipe, Path(args.output), tensor_parallel=args.tensor_parallel)
        print(f"Megatron checkpoint: {out}")
    else:
        out = convert.import_checkpoint(recipe)
        print(f"Megatron checkpoint: {out}")
    return 0

