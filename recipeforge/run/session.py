"""One process running the stage: its immutable context built, the stage set up, trained and saved
(`run.training`), and the main process's files written after (`run.results`)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from recipeforge.backends import worker as w
from recipeforge.backends.base import Backend
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.outputs.preflight import reports_write_errors
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan
from recipeforge.run.results import write_results
from recipeforge.run.training import trained_runner
from recipeforge.stages.context import DistInfo, StageContext


@reports_write_errors
def run_stage(loaded: LoadedRecipe, plan: Plan, run: RunDir, backend: Backend, dist: DistInfo,
              resume_from: Path | None) -> None:
    """Run the stage on `backend` in this process (one rank, or the only process)."""
    from recipeforge.outputs.library_warnings import warnings_to_run_dir

    if plan.device != "cuda":
        from recipeforge.backends.launch import cpu_engine_env

        os.environ.update(cpu_engine_env())
    warnings_to_run_dir(run.root)
    ctx = stage_context(loaded, plan, run, backend, dist, resume_from)
    runner = trained_runner(ctx, backend)
    if dist.is_main:
        write_results(ctx, runner, backend)


def stage_context(loaded: LoadedRecipe, plan: Plan, run: RunDir, backend: Backend, dist: DistInfo,
                  resume_from: Path | None) -> StageContext:
    """The one context of this worker: the backend sets itself up on a first one (`setup_worker`),
    and its hooks and trainer arguments complete the context the stage gets."""
    from recipeforge.backends.expert_parallel import check_resume

    check_resume(plan, resume_from)  # an expert-sharded optimizer state resumes at its own size only
    ctx = StageContext(loaded=loaded, plan=plan, run=run, resume_from=resume_from, dist=dist,
                       save_final=backend.save_final, barrier=w.barrier if dist.world_size > 1 else _no_wait)
    hooks = backend.setup_worker(ctx)
    ctx = replace(ctx, hooks=hooks)
    return replace(ctx, backend_kwargs=dict(backend.trainer_kwargs(ctx)))


def _no_wait() -> None:
    """One process: nobody to wait for."""
