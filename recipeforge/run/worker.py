"""The worker side of a run: one rank of a launched job.

Started by `recipeforge train`, a worker reads its `WorkerSpec` (the plan, the run directory, where
its outcome goes), runs the stage and leaves a typed `Outcome`. Started directly by a launcher
(``torchrun -m recipeforge train ...``, ``accelerate launch -m recipeforge train ...``: no spec), rank 0
plans for the launcher's world and prepares the run directory while the others wait.

`RECIPEFORGE_FAULT=exit:<rank>` kills that rank once the run has finished (after its outcome is
written), so the launching command's answer to a worker that ends badly after the final save can be
tested.

With `distributed.max_restarts`, torch's elastic agent starts the whole group again after a worker
fails; each restarted worker resumes from the newest complete checkpoint (`run.restarts`).
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from recipeforge.backends import get_backend
from recipeforge.backends import worker as w
from recipeforge.backends.parent_death import end_with_parent
from recipeforge.backends.worker_spec import Outcome, OutcomeKind, WorkerSpec, current_spec, write_outcome
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.errors import RecipeError, locate_problems
from recipeforge.log import log
from recipeforge.outputs import run_lock
from recipeforge.outputs.atomic import maybe_fault
from recipeforge.outputs.run_dir import RunDir, default_run_dir
from recipeforge.plan.types import Plan
from recipeforge.plan.world import check_world, plan_for_world
from recipeforge.run import restarts
from recipeforge.run.run_directory import prepare_run
from recipeforge.run.session import evaluate_after_training, push_to_hub, run_stage
from recipeforge.stages.base import DistInfo
from recipeforge.stages.preemption import Preempted


def run_worker(loaded: LoadedRecipe, dist: DistInfo, *, overwrite: bool, force: bool) -> Path:
    """Run this rank of the job; returns the run directory."""
    spec = current_spec()
    with reported_outcome(spec, dist, loaded):
        end_with_parent(signal.SIGTERM)  # the launcher gone: save at the next step boundary and end
        if spec is not None:
            plan, run = launched_plan(spec, loaded)
        else:
            plan, run = plan_among_workers(loaded, dist, overwrite=overwrite, force=force)
        check_world(plan, dist.world_size)
        backend = get_backend(plan.backend)
        backend.check(plan, loaded.recipe)
        if restarts.finished_earlier(run):  # a worker failed on its way out: final/ stands
            if dist.is_main:
                log(f"restart {restarts.restart_count()}: the run finished in an earlier attempt (final/ is "
                    "written); nothing to train")
        else:
            resume_from = restarts.resume_point(loaded.recipe.output.resume, run, dist)
            run_stage(loaded, plan, run, backend, dist, resume_from)
        w.finish()
    if not restarts.is_restart():  # tests: a worker killed after the run finished (once per launch)
        maybe_fault("exit", dist.rank)
    if dist.is_main:
        log(f"done: {run.root}")
        if spec is None:  # launched directly (torchrun -m recipeforge): no launching command pushes
            evaluate_after_training(loaded, run.root)
            push_to_hub(loaded, run.root)
    return run.root


def launched_plan(spec: WorkerSpec, loaded: LoadedRecipe) -> tuple[Plan, RunDir]:
    """The plan the launching command wrote, agreed by every rank, and its run directory (ready)."""
    plan = w.read_plan(Path(spec.plan))
    w.init_process_group(plan.device, loaded.recipe.distributed.timeout_minutes)
    return w.agreed_plan(plan), RunDir(Path(spec.run_dir).absolute())


def plan_among_workers(loaded: LoadedRecipe, dist: DistInfo, *, overwrite: bool, force: bool) -> tuple[Plan, RunDir]:
    """No launching command: rank 0 plans for the launcher's world and prepares the run directory."""
    recipe = loaded.recipe
    run = RunDir(default_run_dir(recipe, Path(loaded.path)).absolute())
    w.init_process_group(w.worker_device(recipe), recipe.distributed.timeout_minutes)
    nnodes, per_node = w.launched_world()
    plan = w.agreed_plan(w.on_main(lambda: plan_for_world(recipe, nnodes=nnodes, nproc_per_node=per_node), dist))
    check_world(plan, dist.world_size)
    if restarts.is_restart():
        # The same launch again (torchrun restarted the worker group): the run directory is this launch's,
        # so it is neither wiped (--overwrite) nor checked as another run's; rank 0 locks it for this
        # attempt, and tidies it before resuming (`restarts.resume_point`).
        w.on_main(lambda: run_lock.acquire(run.root, log=log), dist)
        return plan, run
    w.on_main(lambda: prepare_run(loaded, plan, run, overwrite=overwrite, force=force), dist)
    return plan, run


@contextmanager
def reported_outcome(spec: WorkerSpec | None, dist: DistInfo, loaded: LoadedRecipe) -> Iterator[None]:
    """How the job ended, left next to the spec for the launching command: finished (rank 0),
    preempted (first local rank, after every rank left the process group together), a user error
    (rank 0), out of memory or a diverged loss (any rank)."""
    from recipeforge.plan.oom import OutOfMemory
    from recipeforge.stages.divergence import Diverged

    try:
        yield
    except Preempted as stop:
        w.finish()  # every rank stopped at the same step
        if spec is not None and dist.local_rank == 0:
            write_outcome(spec, Outcome(OutcomeKind.PREEMPTED.value, stop.describe(), stop.to_dict(), dist.rank))
        raise
    except RecipeError as exc:
        kind = (OutcomeKind.OUT_OF_MEMORY if isinstance(exc, OutOfMemory)
                else OutcomeKind.DIVERGED if isinstance(exc, Diverged) else OutcomeKind.USER_ERROR)
        if spec is not None and (dist.is_main or kind != OutcomeKind.USER_ERROR):
            located = locate_problems(exc, loaded.tree.locate)
            write_outcome(spec, Outcome(kind.value, located.render(), rank=dist.rank))
        raise
    if spec is not None and dist.is_main:
        write_outcome(spec, Outcome(OutcomeKind.FINISHED.value, rank=dist.rank))
