"""The files a run directory holds from its start: the resolved recipe, the plan, the environment, the lock file, and metrics.jsonl as the run continues it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs import checkpoint
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan


def write_run_files(loaded: LoadedRecipe, plan: Plan, run: RunDir, resolved: dict[str, Any]) -> None:
    """The resolved recipe, the plan, the environment and the lock file of the run."""
    from recipeforge.config.lock import build_lock, plan_hardware

    run.write_recipe(resolved, Path(loaded.path))
    run.write_plan(plan)
    run.write_environment()
    run.write_lock({**resolved, "lock": build_lock(loaded, plan_hardware(plan))}, Path(loaded.path))


def start_metrics(run: RunDir, resume_from: Path | None) -> None:
    """metrics.jsonl as the run continues it: cut after the resumed step, or started anew."""
    from recipeforge.outputs.metrics import MetricsWriter

    if resume_from is not None:
        MetricsWriter(run.metrics).truncate_after(checkpoint.step_of(resume_from) or 0)
        log(f"resuming from {resume_from}")
    elif run.metrics.exists():
        run.metrics.unlink()
