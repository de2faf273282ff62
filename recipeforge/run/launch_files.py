"""The launch of this node as files and a command: the launcher's (or the Ray driver's) command, the
generated files, the worker spec, and the dry run that prints them."""

from __future__ import annotations

import tempfile
from pathlib import Path

from recipeforge.backends.cluster import ClusterSpec
from recipeforge.backends.launch import LaunchSpec, launch_spec
from recipeforge.backends.ray_launch import ray_address, ray_launch_spec
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.errors import RecipeError
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan
from recipeforge.plan.world import processes_per_node
from recipeforge.run.options import LaunchOptions
from recipeforge.run.spec import launch_settings, recipe_env


def worker_launch(loaded: LoadedRecipe, plan: Plan, run: RunDir, cluster: ClusterSpec, opts: LaunchOptions, *,
                  on_ray: bool = False) -> LaunchSpec:
    """The launcher command, its files and the worker spec of this node (`on_ray`: a Ray driver's
    instead, starting the same workers). Files of the main node go into the run directory; other nodes
    keep theirs node-local, so they never touch what the main node prepares (or wipes with --overwrite)."""
    files_dir = None if cluster.is_main_node or opts.dry_run else Path(tempfile.mkdtemp(prefix="recipeforge-launch-"))
    spec = launch_spec(plan, loaded.recipe, recipe_path=worker_recipe_path(loaded, run, opts),
                       overrides=opts.overrides, run_dir=run.root, cluster=cluster, files_dir=files_dir,
                       settings=launch_settings(opts), recipe_env=recipe_env())
    if on_ray:  # the same launch, its workers started by Ray Train on a Ray cluster
        spec = ray_launch_spec(spec, plan, loaded.recipe, run_dir=run.root,
                               address=ray_address(loaded.recipe, opts.ray_address))
    return spec


def worker_recipe_path(loaded: LoadedRecipe, run: RunDir, opts: LaunchOptions) -> str:
    """The recipe file the workers load: the one on the command line, or (called as a library) the
    resolved recipe the run directory keeps (overrides, defaults and absolute data paths included),
    unless values in it had to be redacted."""
    if opts.recipe_path is not None:
        return opts.recipe_path
    from recipeforge.config.secrets import has_redactions

    if has_redactions(loaded):  # secrets from the environment, or credentials written in the recipe
        raise RecipeError("this recipe holds secrets that its written copy redacts; launch it with the command line",
                          hint="run `recipeforge train RECIPE ...` so every worker resolves the recipe itself")
    return str(run.resolved_recipe)


def print_dry_run(plan: Plan, spec: LaunchSpec) -> None:
    """Print the plan's line and the launch (the printed command never shows a password from an
    override; the launched one keeps it)."""
    from recipeforge.credentials import redact_credentials

    print(redact_credentials(f"# plan: {plan_line(plan)}\n" + spec.render()), end="")


def plan_line(plan: Plan) -> str:
    """One line: backend, processes and the batch arithmetic."""
    per = processes_per_node(plan)
    unit = ("GPU" if per == 1 else "GPUs") if plan.device == "cuda" else ("CPU process" if per == 1 else "CPU processes")
    return (f"{plan.backend}{f' ({plan.preset})' if plan.preset else ''}, {plan.nodes} node(s) x {per} {unit} = "
            f"{plan.world_size} processes; micro batch {plan.micro_batch_size} x accumulation "
            f"{plan.gradient_accumulation} x data parallel {plan.data_parallel} = global batch {plan.global_batch_size}")
