"""`recipeforge tune`: short measuring runs that suggest a setting of the recipe. Its one sub-command so far,
`tune lr`, is the learning-rate range test (`run.tuning`, `stages.lr_range`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from recipeforge.cli.common import flag_values, recipe_args

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers


def add_tune(sub: Subparsers) -> None:
    p = sub.add_parser("tune", help="short measuring runs that suggest a recipe setting (tune lr: the "
                                    "learning-rate range test)",
                       description="Short measuring runs on the recipe's own model and data that suggest a "
                                   "setting; each prints the override to use.",
                       epilog="tune lr RECIPE [key=value ...] [--start 1e-7] [--end 1] [--steps 100] [--overwrite]: "
                              "the learning-rate range test (`recipeforge tune lr --help`).")
    kinds = p.add_subparsers(dest="tune_command", metavar="{lr}", required=True)
    p.set_defaults(func=cmd_tune)
    lr = kinds.add_parser(
        "lr", help="learning-rate range test: train from a low to a high rate and suggest one",
        description="Train the recipe's model on its data, optimizer and backend (in this one process) with the "
                    "rate raised exponentially from --start to --end over --steps optimizer steps, one logged "
                    "loss per step. The recipe's scheduler and warmup are overridden for the test. The loss is "
                    "smoothed (moving average, beta 0.98, bias-corrected); the test stops when the smoothed loss "
                    "exceeds 4x its best. The suggested rate is the steepest descent of the smoothed loss against "
                    "log10(rate) before that (fastai's 'steep' rule). Nothing is saved as a model: the run "
                    "directory <output.dir>-lr-range holds lr_range.json and lr_range.png (matplotlib).",
        epilog="Prints the suggested rate and the override to train with (train.learning_rate=...). A recipe "
               "planned for several processes is refused (exit 2): run the test on one device.")
    recipe_args(lr)
    lr.add_argument("--start", type=float, default=1e-7, help="the first rate (default 1e-7)")
    lr.add_argument("--end", type=float, default=1.0, help="the last rate (default 1)")
    lr.add_argument("--steps", type=int, default=100, help="optimizer steps from --start to --end (default 100, "
                                                           "at least 10)")
    lr.add_argument("--overwrite", action="store_true",
                    help="replace the directory <output.dir>-lr-range also when it holds a training run (an "
                         "earlier range test there is always replaced)")
    lr.set_defaults(func=cmd_tune_lr)


def cmd_tune(args: argparse.Namespace) -> int:
    """`tune` without what to tune: argparse refuses it first (a sub-command is required); the list."""
    print("recipeforge tune: name what to tune: lr")
    return 2


def cmd_tune_lr(args: argparse.Namespace) -> int:
    """Run the range test and print the suggested rate, its override and the plot's path."""
    from recipeforge.run.range_checks import check_range
    from recipeforge.stages.lr_range import RULE

    check_range(args.start, args.end, args.steps)  # before training's modules load
    from recipeforge.run.tuning import lr_range_test

    out = lr_range_test(args.recipe, list(args.overrides), start=args.start, end=args.end, steps=args.steps,
                        overwrite=args.overwrite, flags=flag_values(args))
    r = out.result
    stop = (f"diverged at {r.diverged_at:.3g} after {len(r.losses)} steps" if r.diverged_at is not None
            else f"ran all {len(r.losses)} steps to {r.lrs[-1]:.3g} without diverging" if r.lrs
            else "logged no loss")
    print(f"lr range test: {r.start:g} -> {r.end:g}, {stop}")
    if r.suggestion is None:
        print(f"no suggestion: too few losses before divergence; see {out.json_path} (lower --start or add --steps)")
    else:
        print(f"suggested learning rate: {r.suggestion:.2e} ({RULE}: steepest descent of the smoothed loss)")
        print(f"to use it: train.learning_rate={r.suggestion:.2e}")
        if r.diverged_at is None and r.suggestion == r.lrs[-1]:
            print("note: the loss was still falling fastest at the last rate tried; raise --end (or add --steps) "
                  "to see where it turns")
    print(f"curve: {out.png_path or out.json_path}")
    return 0
