"""The run directory before training: refused, checked, locked, (re)written, and the checkpoint to
resume from. The main process of the main node does this, once, before any worker starts."""

from __future__ import annotations

from pathlib import Path

from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs import checkpoint, run_lock
from recipeforge.outputs.preflight import reports_write_errors
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan
from recipeforge.run.location import refuse_before_writing
from recipeforge.run.resolved import resolved_for_run
from recipeforge.run.run_files import start_metrics, write_run_files

__all__ = ["prepare_run", "resolved_for_run"]


@reports_write_errors
def prepare_run(loaded: LoadedRecipe, plan: Plan, run: RunDir, *, overwrite: bool, force: bool = False) -> Path | None:
    """Create (or check, or with `overwrite` wipe) the run directory and write the recipe, plan and
    environment; returns the checkpoint to resume from."""
    from recipeforge.outputs.library_warnings import warnings_to_run_dir
    from recipeforge.outputs.run_dir import prepare
    from recipeforge.outputs.run_guard import check_existing_run

    recipe = loaded.recipe
    refuse_before_writing(loaded, plan, run, overwrite=overwrite)
    run_lock.acquire(run.root, log=log)  # one run per directory, held until this process ends
    resolved = resolved_for_run(loaded, run)
    if not overwrite:
        check_existing_run(run, resolved, force=force)
    named = None
    if recipe.output.resume not in ("auto", "never"):  # verified (a damaged one is exit 2, naming the file)
        named = checkpoint.resume_checkpoint(recipe.output.resume, run.checkpoints, verify=True)
    prepare(run, overwrite=overwrite, resume=recipe.output.resume)
    warnings_to_run_dir(run.root)
    run_lock.reassert(run.root, log=log)  # --overwrite removed the lock file with the rest
    checkpoint.remove_incomplete(run.checkpoints)
    resume_from = named or checkpoint.resume_checkpoint(recipe.output.resume, run.checkpoints, verify=True, log=log)
    write_run_files(loaded, plan, run, resolved)
    start_metrics(run, resume_from)
    return resume_from
