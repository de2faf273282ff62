"""What the launching command checks before anything is written: the plan's backend, its numbers, the
recipe's lock, the node count, and whether the workers start on a Ray cluster."""

from __future__ import annotations

from recipeforge.backends import get_backend
from recipeforge.backends.base import Backend
from recipeforge.backends.cluster import ClusterSpec
from recipeforge.backends.ray_launch import check_ray_installed, wants_ray
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.errors import RecipeError
from recipeforge.log import log
from recipeforge.plan.types import Plan
from recipeforge.run.options import LaunchOptions


def accepted_backend(loaded: LoadedRecipe, plan: Plan, cluster: ClusterSpec, opts: LaunchOptions) -> Backend:
    """The plan's backend, once it, the plan's numbers, the recipe's lock and the node count accept
    the run (the launching command checks; its workers run what it accepted)."""
    from recipeforge.components.data_checks import check_plan_numbers

    backend = get_backend(plan.backend)
    backend.check(plan, loaded.recipe)
    check_plan_numbers(plan)
    if loaded.recipe.lock is not None:
        from recipeforge.config.lock import check_lock, plan_hardware

        check_lock(loaded, plan_hardware(plan), strict=opts.strict, warn=log)
    if plan.nodes != cluster.nnodes and not wants_ray(loaded.recipe, opts):  # Ray places workers on its nodes
        raise RecipeError(f"the plan spans {plan.nodes} nodes, and this command was started for {cluster.nnodes}",
                          key="hardware.nodes",
                          hint="start one `recipeforge train` per node with --nnodes/--node-rank/--master-addr, "
                               "or submit `recipeforge launch --slurm RECIPE`")
    return backend


def launches_on_ray(loaded: LoadedRecipe, opts: LaunchOptions) -> bool:
    """Whether Ray Train starts the workers (`launch --ray`, `distributed.launcher: ray`); Ray must then
    be installed here, unless the launch is only printed."""
    on_ray = wants_ray(loaded.recipe, opts)
    if on_ray and not opts.dry_run:
        check_ray_installed()
    return on_ray
