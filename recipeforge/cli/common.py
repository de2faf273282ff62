"""What several commands share: the recipe arguments, loading the recipe a command names, writing the
result to a file or stdout, the flags a launching command hands its workers, and the libraries' warnings
sent to a run's log while a command uses the run."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from typing import TypeAlias

    from recipeforge.config.overrides import FlagValue

    # What `ArgumentParser.add_subparsers` returns: each command's `add_*` adds its parser to it.
    Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def recipe_args(p: argparse.ArgumentParser) -> None:
    """The recipe file and its `key=value` overrides, as every recipe command takes them."""
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="overrides such as train.learning_rate=1e-4; ~key deletes a key")


def looks_like_override(arg: str) -> bool:
    """`key=value` or `~key`: an override, wherever it stands on the command line."""
    return not arg.startswith("-") and ("=" in arg or arg.startswith("~"))


def load(args: argparse.Namespace) -> Any:
    """The recipe the command names, loaded and checked as far as the command needs (a `LoadedRecipe`).
    ``args.text``, when set, is the recipe's text in place of the file's (an edit in `recipeforge ui`).

    It is kept on ``args.loaded``: errors raised later (planner, data) then point into the recipe."""
    from recipeforge.config import load_recipe

    loaded = load_recipe(args.recipe, list(args.overrides), flags=flag_values(args), text=getattr(args, "text", None))
    args.loaded = loaded
    from recipeforge.config.load import check_finite_numbers

    check_finite_numbers(loaded.recipe.model_dump(), loaded.tree.locate)  # '1e999' or 'nan' for a number
    trains = args.command == "train" or getattr(args, "ray", False)  # `launch --ray` trains too
    if args.command in ("validate", "plan") or trains:
        from recipeforge.config.validate import check_components

        check_components(loaded)
    if args.command == "validate" or trains:
        # Local eval task files and lm-eval itself are checked before hours of training, not after.
        from recipeforge.tools.evaluation.tasks import check_recipe_tasks

        section = loaded.recipe.eval
        check_recipe_tasks(list(section.tasks), Path(loaded.path).resolve().parent,
                           needs_harness=section.after_training, allow_code=loaded.recipe.allow_code)
    return loaded


def flag_values(args: argparse.Namespace) -> list[FlagValue]:
    """What the command's flags put into the recipe, whatever the recipe sets itself."""
    from recipeforge.config.overrides import FlagValue

    flags = []
    if getattr(args, "hardware", None):
        from recipeforge.plan.hardware import parse_hardware

        # `--hardware` replaces the recipe's `hardware:` section (or stands in for a missing one) as the
        # target, for the checks made while loading (which backend runs on which device) as for the planner.
        flags.append(FlagValue(("hardware",), parse_hardware(args.hardware, nnodes=getattr(args, "nnodes", None)).as_section(),
                               f"--hardware {args.hardware}"))
    return flags


def hardware_overrides(args: argparse.Namespace) -> list[str]:
    """`--hardware` as recipe overrides (``hardware.nodes=2`` ...), for commands that run elsewhere."""
    if not getattr(args, "hardware", None):
        return []
    from recipeforge.plan.hardware import parse_hardware

    section = parse_hardware(args.hardware).as_section()
    return [f"hardware.{key}={value}" for key, value in section.items()]


class WorkerFlags(TypedDict):
    """The global flags a launching command hands its workers (`LaunchOptions` fields)."""

    debug: bool
    verbose: bool
    trust_code: bool


def worker_flags(args: argparse.Namespace) -> WorkerFlags:
    """The launching command's flags its workers get on their command line."""
    from recipeforge.outputs.console import verbose
    from recipeforge.registry import code_trust

    return WorkerFlags(debug=args.debug or os.environ.get("RECIPEFORGE_DEBUG", "") not in ("", "0"),
                verbose=verbose(), trust_code=code_trust()[0])


def write_output(text: str, path: str | None) -> None:
    """`text` into the file `path`, or on stdout without one."""
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)


@contextmanager
def library_warnings_to(run_dir: Path) -> Iterator[None]:
    """While a command uses a finished run, the libraries' noise (loading bars, deprecations) goes to the
    run's logs/warnings.log, as in training (when `run_dir` is a finished run: it has final/)."""
    from recipeforge.outputs import library_warnings

    library_warnings.route_library_warnings(0)
    try:
        if (run_dir / "final").is_dir():
            library_warnings.warnings_to_run_dir(run_dir)
        yield
    finally:
        library_warnings.stop_routing()
