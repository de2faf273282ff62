"""The launching side of `recipeforge train`: plan, take the run directory, prepare the data, write the
worker spec, start the workers, and turn their outcome into the command's result.

`launch` reads as the run does, one step per line; each step is a function of its own module
(`run.acceptance`, `run.launch_files`, `run.preparation`, `run.start`, `run.after`) or a backend's hook. With one process and
no launcher, the run trains in this process (`run.in_place.train_here`)."""

from __future__ import annotations

from pathlib import Path

from recipeforge.backends.cluster import detect_cluster
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.outputs.run_dir import RunDir, default_run_dir
from recipeforge.plan.types import Plan
from recipeforge.plan.world import plan_for_world
from recipeforge.run.acceptance import accepted_backend, launches_on_ray
from recipeforge.run.after import finish_run
from recipeforge.run.in_place import train_here
from recipeforge.run.launch_files import print_dry_run, worker_launch
from recipeforge.run.options import LaunchOptions
from recipeforge.run.preparation import prepare_launch
from recipeforge.run.start import start_workers


def launch(loaded: LoadedRecipe, plan: Plan | None, opts: LaunchOptions, *, overwrite: bool,
           force: bool) -> Path | None:
    """The command a user runs: plan, then train here or start the launcher (on every node); returns
    the run directory (None for a dry run)."""
    cluster = detect_cluster(opts.nnodes, opts.node_rank, opts.master_addr, opts.master_port)
    plan = plan or plan_for_world(loaded.recipe, nnodes=cluster.nnodes if cluster.source != "local" else None,
                                  nproc_per_node=opts.nproc_per_node)
    backend = accepted_backend(loaded, plan, cluster, opts)
    run = RunDir(default_run_dir(loaded.recipe, Path(loaded.path)).absolute())
    on_ray = launches_on_ray(loaded, opts)
    if backend.launcher(plan) == "none" and not opts.dry_run and not on_ray:
        return train_here(loaded, plan, run, opts, overwrite=overwrite, force=force)
    spec = worker_launch(loaded, plan, run, cluster, opts, on_ray=on_ray)
    if opts.dry_run:
        print_dry_run(plan, spec)
        return None
    prepare_launch(loaded, plan, run, backend, cluster, overwrite=overwrite, force=force)
    start_workers(spec, run)
    if cluster.is_main_node:
        finish_run(loaded, plan, run, backend)  # e.g. Megatron's export to final/, then eval and push
    return run.root
