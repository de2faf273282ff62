"""`recipeforge tune lr`: the learning-rate range test run on the recipe's own model, data, optimizer and
backend, in this process (`stages.lr_range` holds the test itself, `run.range_checks` what it refuses,
`run.range_test` its training).

The recipe is loaded with the test's settings over it: `train.max_steps` = the test's steps, a constant
schedule without warmup (the test's callback sets every step's rate), a loss logged every step, the
divergence watch off (the test stops on its own rule), no checkpoint and no evaluation inside the test.
The run directory is ``<output.dir>-lr-range`` beside the recipe's own; it gets the run's usual files
(resolved recipe, plan, metrics.jsonl) plus lr_range.json and lr_range.png, and never final/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from recipeforge.config import load_recipe
from recipeforge.config.overrides import FlagValue
from recipeforge.config.validate import check_components
from recipeforge.log import log
from recipeforge.outputs import library_warnings, run_lock
from recipeforge.outputs.run_dir import RunDir, default_run_dir
from recipeforge.run.network import network_guards
from recipeforge.run.range_checks import check_range, one_process_plan, refuse_training_run
from recipeforge.run.range_test import RangeOutcome, run_range_test
from recipeforge.run.run_directory import prepare_run
from recipeforge.stages.lr_range import RangeResult

__all__ = ["RangeOutcome", "check_range", "lr_range_test", "range_run_dir", "test_overrides"]

SUFFIX = "-lr-range"


def test_overrides(steps: int) -> list[str]:
    """The recipe settings the test puts over the recipe's own."""
    return [f"train.max_steps={steps}", "train.scheduler=constant", "train.warmup_steps=0", "train.logging_steps=1",
            f"train.eval_steps={steps + 1}", f"output.save_steps={steps + 1}", "output.resume=never",
            "train.divergence.stop_on_nan=false", "train.divergence.spike_factor=null"]


def range_run_dir(recipe_path: str, overrides: Sequence[str], flags: Sequence[FlagValue]) -> Path:
    """``<the recipe's run directory>-lr-range``: beside the run `recipeforge train` would write."""
    loaded = load_recipe(recipe_path, list(overrides), flags=list(flags))
    root = default_run_dir(loaded.recipe, Path(loaded.path)).absolute()
    return root.with_name(root.name + SUFFIX)


def lr_range_test(recipe_path: str, overrides: Sequence[str], *, start: float, end: float, steps: int,
                  overwrite: bool, flags: Sequence[FlagValue] = ()) -> RangeOutcome:
    """Run the range test of the recipe at `recipe_path` (with the user's `overrides`); one process."""
    check_range(start, end, steps)
    network_guards()
    root = range_run_dir(recipe_path, overrides, flags)
    loaded = load_recipe(recipe_path, [*overrides, *test_overrides(steps), f"output.dir={root}"], flags=list(flags))
    check_components(loaded)
    plan, backend = one_process_plan(loaded.recipe)
    run = RunDir(root)
    refuse_training_run(run, overwrite=overwrite)
    library_warnings.route_library_warnings(0)
    try:
        # Each test starts over: a directory of an earlier test (recipeforge's, `ownership`) is replaced.
        prepare_run(loaded, plan, run, overwrite=run.root.exists())
        return run_range_test(loaded, plan, run, backend, RangeResult(start=start, end=end, steps=steps), log)
    finally:
        library_warnings.stop_routing(log=log)
        run_lock.release_all()
