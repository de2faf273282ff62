"""A worker group a launcher started on `recipeforge train` itself (``torchrun -m recipeforge train x.yaml``,
``accelerate launch -m recipeforge train x.yaml``): no launching command wrote a spec, so rank 0 plans
for the launcher's world, prepares the run directory, writes the spec into it and shares its path;
then every rank runs the worker entry (`run.worker.run_worker`) on it, as a launched worker does.
"""

from __future__ import annotations

from pathlib import Path

from recipeforge.backends import worker as w
from recipeforge.backends.worker_spec import SPEC_NAME, WorkerSpec
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs import run_lock
from recipeforge.outputs.run_dir import RunDir, default_run_dir
from recipeforge.plan.types import Plan
from recipeforge.plan.world import check_world, plan_for_world
from recipeforge.run import restarts
from recipeforge.run.run_directory import prepare_run
from recipeforge.run.options import LaunchOptions
from recipeforge.run.spec import spec_for
from recipeforge.run.worker import run_worker
from recipeforge.stages.context import DistInfo


def run_group(loaded: LoadedRecipe, dist: DistInfo, opts: LaunchOptions, *, overwrite: bool, force: bool) -> Path:
    """This rank of a group started without a spec; returns the run directory."""
    from recipeforge.run.session import evaluate_after_training, push_to_hub

    spec = shared_spec(loaded, dist, opts, overwrite=overwrite, force=force)
    root = run_worker(WorkerSpec.read_trusted(Path(spec)), loaded, dist)
    if dist.is_main:  # no launching command: rank 0 evaluates and pushes
        evaluate_after_training(loaded, root)
        push_to_hub(loaded, root)
    return root


def shared_spec(loaded: LoadedRecipe, dist: DistInfo, opts: LaunchOptions, *, overwrite: bool, force: bool) -> str:
    """Rank 0 plans, prepares the run directory and writes the spec there; every rank gets its path."""
    recipe = loaded.recipe
    run = RunDir(default_run_dir(recipe, Path(loaded.path)).absolute())
    w.init_process_group(w.worker_device(recipe), recipe.distributed.timeout_minutes)
    nnodes, per_node = w.launched_world()
    plan = w.agreed_plan(w.on_main(lambda: plan_for_world(recipe, nnodes=nnodes, nproc_per_node=per_node), dist))
    check_world(plan, dist.world_size)
    path = w.on_main(lambda: _prepare(loaded, plan, run, opts, overwrite=overwrite, force=force), dist)
    shared = w.broadcast(path)
    assert shared is not None  # rank 0 wrote it (`on_main` raised on every rank otherwise)
    return shared


def _prepare(loaded: LoadedRecipe, plan: Plan, run: RunDir, opts: LaunchOptions, *, overwrite: bool,
             force: bool) -> str:
    """Rank 0: the run directory ready (or, on an elastic restart, locked again) and the spec written."""
    if restarts.is_restart():
        # The same launch again (torchrun restarted the worker group): the run directory is this launch's,
        # so it is neither wiped (--overwrite) nor checked as another run's; rank 0 locks it for this
        # attempt, and tidies it before resuming (`restarts.resume_point`).
        run_lock.acquire(run.root, log=log)
        run.write_plan(plan)  # this attempt's plan (the same launch plans the same)
    else:
        prepare_run(loaded, plan, run, overwrite=overwrite, force=force)
    path = run.root / SPEC_NAME
    spec_for(loaded, opts, plan_path=run.plan, run_dir=run.root, outcome=None).write(path)
    return str(path)
