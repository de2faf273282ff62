"""`recipeforge tune lr`: the learning-rate range test run on the recipe's own model, data, optimizer and
backend, in this process (`stages.lr_range` holds the test itself).

The recipe is loaded with the test's settings over it: `train.max_steps` = the test's steps, a constant
schedule without warmup (the test's callback sets every step's rate), a loss logged every step, the
divergence watch off (the test stops on its own rule), no checkpoint and no evaluation inside the test.
The run directory is ``<output.dir>-lr-range`` beside the recipe's own; it gets the run's usual files
(resolved recipe, plan, metrics.jsonl) plus lr_range.json and lr_range.png, and never final/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from recipeforge.config.overrides import FlagValue
from recipeforge.errors import RecipeError
from recipeforge.stages.lr_range import MIN_STEPS, RangeResult

if TYPE_CHECKING:
    from recipeforge.backends.base import Backend
    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan.types import Plan

SUFFIX = "-lr-range"


@dataclass(frozen=True)
class RangeOutcome:
    """The test's result and where its files are."""

    result: RangeResult
    run_dir: Path
    json_path: Path
    png_path: Path | None


def check_range(start: float, end: float, steps: int) -> None:
    """Refuse a range the test cannot run (exit 2 at the command line)."""
    import math

    if not (math.isfinite(start) and math.isfinite(end)) or start <= 0:
        raise RecipeError(f"--start and --end must be positive finite numbers (got {start:g} and {end:g})", key="--start")
    if start >= end:
        raise RecipeError(f"must be below --end ({start:g} >= {end:g}): the test raises the rate",
                          key="--start", hint="e.g. --start 1e-7 --end 1")
    if steps < MIN_STEPS:
        raise RecipeError(f"must be {MIN_STEPS} or more (got {steps}): the smoothed loss needs points",
                          key="--steps", hint="the default, 100, suits most runs")


def test_overrides(steps: int) -> list[str]:
    """The recipe settings the test puts over the recipe's own."""
    return [f"train.max_steps={steps}", "train.scheduler=constant", "train.warmup_steps=0", "train.logging_steps=1",
            f"train.eval_steps={steps + 1}", f"output.save_steps={steps + 1}", "output.resume=never",
            "train.divergence.stop_on_nan=false", "train.divergence.spike_factor=null"]


def range_run_dir(recipe_path: str, overrides: Sequence[str], flags: Sequence[FlagValue]) -> Path:
    """``<the recipe's run directory>-lr-range``: beside the run `recipeforge train` would write."""
    from recipeforge.config import load_recipe
    from recipeforge.outputs.run_dir import default_run_dir

    loaded = load_recipe(recipe_path, list(overrides), flags=list(flags))
    root = default_run_dir(loaded.recipe, Path(loaded.path)).absolute()
    return root.with_name(root.name + SUFFIX)


def lr_range_test(recipe_path: str, overrides: Sequence[str], *, start: float, end: float, steps: int,
                  overwrite: bool, flags: Sequence[FlagValue] = ()) -> RangeOutcome:
    """Run the range test of the recipe at `recipe_path` (with the user's `overrides`); one process."""
    from recipeforge.backends import get_backend
    from recipeforge.config import load_recipe
    from recipeforge.config.validate import check_components
    from recipeforge.log import log
    from recipeforge.outputs import library_warnings, run_lock
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan.world import plan_for_world
    from recipeforge.run import network_guards
    from recipeforge.run.run_directory import prepare_run
    from recipeforge.stage_specs import STAGE_SPECS, Stage

    check_range(start, end, steps)
    network_guards()
    root = range_run_dir(recipe_path, overrides, flags)
    loaded = load_recipe(recipe_path, [*overrides, *test_overrides(steps), f"output.dir={root}"], flags=list(flags))
    check_components(loaded)
    recipe = loaded.recipe
    if STAGE_SPECS[Stage(recipe.stage)].rollout:
        # Every rollout stage (grpo, rloo, a plugin's) optimizes a policy objective on sampled completions.
        raise RecipeError(f"the range test reads a training loss that falls as the model learns; {recipe.stage}'s "
                          "loss is a policy objective on sampled rollouts and says little about the rate",
                          key="stage", hint=f"tune the rate of a {recipe.stage} run with short trial runs")
    plan = plan_for_world(recipe)
    backend = get_backend(plan.backend)
    backend.check(plan, recipe)
    if plan.world_size > 1 or backend.launcher(plan) != "none":
        raise RecipeError(f"the range test runs in this one process, and this recipe plans {plan.world_size} "
                          f"processes on the {plan.backend} backend", key="distributed.backend",
                          hint="add hardware.gpus_per_node=1 distributed.backend=single (the rate found on one "
                               "device carries over when the global batch is the same)")
    run = RunDir(root)
    if run.has_results() and not overwrite:
        raise RecipeError(f"{root} holds a training run (final/ or checkpoints/), not a range test", key="output.dir",
                          hint="pass --overwrite to replace it, or set output.dir to another directory")
    library_warnings.route_library_warnings(0)
    try:
        # Each test starts over: a directory of an earlier test (recipeforge's, `ownership`) is replaced.
        prepare_run(loaded, plan, run, overwrite=run.root.exists())
        return _run_test(loaded, plan, run, backend, RangeResult(start=start, end=end, steps=steps), log)
    finally:
        library_warnings.stop_routing(log=log)
        run_lock.release_all()


def _run_test(loaded: LoadedRecipe, plan: Plan, run: RunDir, backend: Backend, result: RangeResult,
              log: Callable[[str], None]) -> RangeOutcome:
    """Set up the stage, train with the test's callback, write the files; the model is not saved."""
    from recipeforge.outputs.trackers import close_all
    from recipeforge.run.session import stage_context
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import DistInfo
    from recipeforge.stages.lr_range import make_callbacks, write_files

    ctx = stage_context(loaded, plan, run, backend, DistInfo(), None)
    runner = runner_class(ctx.recipe.stage, backend.runner(ctx.recipe.stage))(ctx)
    runner.setup()
    first, last = make_callbacks(result, log)
    runner.trainer.callback_handler.callbacks.insert(0, first)  # sets the logged rate before others read it
    runner.trainer.add_callback(last)
    failed = True
    try:
        runner.trainer.train()
        failed = False
    finally:
        close_all(runner.trackers, failed=failed)
    result.finish()
    json_path, png_path = write_files(result, ctx.run.root, log)
    return RangeOutcome(result=result, run_dir=ctx.run.root, json_path=json_path, png_path=png_path)
