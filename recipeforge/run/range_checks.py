"""What the learning-rate range test refuses before it trains: a range it cannot sweep, a rollout stage
(whose loss says little about the rate), a recipe planned on more than this one process, and a run
directory that holds a training run."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from recipeforge.backends import get_backend
from recipeforge.errors import RecipeError
from recipeforge.plan.world import plan_for_world
from recipeforge.stage_specs import stage_spec
from recipeforge.stages.lr_range import MIN_STEPS

if TYPE_CHECKING:
    from recipeforge.backends.base import Backend
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan.types import Plan


def check_range(start: float, end: float, steps: int) -> None:
    """Refuse a range the test cannot run (exit 2 at the command line)."""
    if not (math.isfinite(start) and math.isfinite(end)) or start <= 0:
        raise RecipeError(f"--start and --end must be positive finite numbers (got {start:g} and {end:g})", key="--start")
    if start >= end:
        raise RecipeError(f"must be below --end ({start:g} >= {end:g}): the test raises the rate",
                          key="--start", hint="e.g. --start 1e-7 --end 1")
    if steps < MIN_STEPS:
        raise RecipeError(f"must be {MIN_STEPS} or more (got {steps}): the smoothed loss needs points",
                          key="--steps", hint="the default, 100, suits most runs")


def one_process_plan(recipe: Recipe) -> tuple[Plan, Backend]:
    """The recipe's plan and backend, refused unless the test can run it in this one process."""
    if stage_spec(recipe.stage).rollout:
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
    return plan, backend


def refuse_training_run(run: RunDir, *, overwrite: bool) -> None:
    """A directory that holds a training run is replaced only with --overwrite."""
    if run.has_results() and not overwrite:
        raise RecipeError(f"{run.root} holds a training run (final/ or checkpoints/), not a range test",
                          key="output.dir", hint="pass --overwrite to replace it, or set output.dir to another directory")
