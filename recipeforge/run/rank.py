"""One rank of a run, whoever started it: `run_worker`, the worker entry's body (`run.worker`)."""

from __future__ import annotations

import signal
from pathlib import Path

from recipeforge.backends import get_backend
from recipeforge.backends import worker as w
from recipeforge.backends.parent_death import end_with_parent
from recipeforge.backends.worker_spec import WorkerSpec
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs.run_dir import RunDir
from recipeforge.run import restarts
from recipeforge.run.outcome import reported_outcome
from recipeforge.run.session import run_stage
from recipeforge.settings import installed
from recipeforge.stages.context import DistInfo


def run_worker(spec: WorkerSpec, loaded: LoadedRecipe, dist: DistInfo) -> Path:
    """Run this rank of the job the spec describes; returns the run directory."""
    launched = spec.outcome is not None  # a process of its own, started by a launcher
    with installed(spec.settings):
        with reported_outcome(spec, dist, loaded):
            root = _run(spec, loaded, dist, launched=launched)
        if launched:
            restarts.exit_fault(dist.rank)  # tests: a worker killed after the run finished (once per launch)
    if dist.is_main:
        log(f"done: {root}")
    return root


def _run(spec: WorkerSpec, loaded: LoadedRecipe, dist: DistInfo, *, launched: bool) -> Path:
    """The job itself: the agreed plan, its backend, the stage run (or, restarted after it finished,
    nothing), every rank leaving the process group together."""
    if launched or dist.world_size > 1:
        end_with_parent(signal.SIGTERM)  # the launcher gone: save at the next step boundary and end
    plan = w.launched_plan(Path(spec.plan), dist.world_size, loaded.recipe.distributed.timeout_minutes)
    backend = get_backend(plan.backend)
    backend.check(plan, loaded.recipe)
    run = RunDir(Path(spec.run_dir))
    if restarts.finished_earlier(run):  # a worker failed on its way out: final/ stands
        if dist.is_main:
            log(f"restart {restarts.restart_count()}: the run finished in an earlier attempt (final/ is "
                "written); nothing to train")
    else:
        resume_from = restarts.resume_point(loaded.recipe.output.resume, run, dist)
        run_stage(loaded, plan, run, backend, dist, resume_from)
    w.finish()
    return run.root
