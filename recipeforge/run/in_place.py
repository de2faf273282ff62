"""One process, no launcher: the run trained inside the command a user typed, through the worker entry."""

from __future__ import annotations

from pathlib import Path

from recipeforge.backends.worker_spec import SPEC_NAME, WorkerSpec
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan
from recipeforge.run.after import finish_run
from recipeforge.run.options import LaunchOptions
from recipeforge.run.rank import run_worker
from recipeforge.run.run_directory import prepare_run
from recipeforge.run.spec import spec_for
from recipeforge.stages import preemption
from recipeforge.stages.context import DistInfo


def train_here(loaded: LoadedRecipe, plan: Plan, run: RunDir, opts: LaunchOptions, *, overwrite: bool,
               force: bool) -> Path:
    """Prepare the run directory, write the spec there and run the worker entry on it in this process
    (the recipe already loaded), then evaluate and push."""
    if loaded.recipe.distributed.max_restarts:
        # Restarts are the elastic agent's; one process trains here, with no agent to restart it.
        log(f"warning: distributed.max_restarts={loaded.recipe.distributed.max_restarts} has no effect: one "
            "process trains inside this command (no launcher); rerun the command to resume")
    preemption.install()  # SIGTERM/SIGUSR1/Ctrl-C: save a checkpoint at the end of the step, then stop
    prepare_run(loaded, plan, run, overwrite=overwrite, force=force)
    path = run.root / SPEC_NAME
    spec_for(loaded, opts, plan_path=run.plan, run_dir=run.root, outcome=None).write(path)
    try:
        spec = WorkerSpec.read_trusted(path)
    finally:
        path.unlink(missing_ok=True)  # its overrides and environment values may hold credentials
    run_worker(spec, loaded, DistInfo())
    finish_run(loaded, plan, run)
    return run.root
