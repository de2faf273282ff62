"""The workers started through the launcher, and their outcome read into the command's result."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from recipeforge.backends.launch import LaunchSpec, run_launcher
from recipeforge.backends.worker_spec import OUTCOME_NAME, Outcome, OutcomeKind, read_outcome, write_outcome_file
from recipeforge.errors import RecipeError
from recipeforge.log import log
from recipeforge.outputs import run_lock
from recipeforge.outputs.run_dir import RunDir
from recipeforge.run.options import LaunchFailed
from recipeforge.stages import preemption


def start_workers(spec: LaunchSpec, run: RunDir) -> None:
    """Start the launcher and wait for it; the workers' outcome decides the result: preempted (exit
    75), a user error only a worker could see (exit 2), another failure (`LaunchFailed`). A worker that
    ended badly after the run finished (every rank saved and left the process group) is a warning."""
    outcome_path = spec.outcome_path or run.root / OUTCOME_NAME
    outcome_path.unlink(missing_ok=True)  # an earlier launch's
    lock = run_lock.held(run.root)
    try:
        code = run_launcher(spec, log=log, pass_fds=(lock.fd,) if lock is not None else ())
    finally:
        # The workers read their spec when they start (elastic restarts too, within the launcher); its
        # overrides and environment values may hold credentials, which the run directory must not keep.
        if spec.spec_path is not None:
            spec.spec_path.unlink(missing_ok=True)
    outcome = read_outcome(outcome_path)
    if outcome is not None and outcome.kind == OutcomeKind.PREEMPTED:
        raise preemption.Preempted.from_dict(outcome.preempted or {})
    if code != 0 and outcome is not None and outcome.kind == OutcomeKind.FINISHED:
        warn_unclean_exit(outcome_path, outcome, code)
        return
    if code != 0:
        if outcome is not None and outcome.kind in OutcomeKind.user_errors():
            raise RecipeError(outcome.message or "a worker reported a problem in the recipe")
        raise LaunchFailed(code)


def warn_unclean_exit(outcome_path: Path, outcome: Outcome, code: int) -> None:
    """A worker exited with an error after the run finished: final/ is complete (every rank saved
    and left the process group before rank 0 wrote `finished`), so the run stands, but the exit is
    said on the console and kept in the outcome rather than passed over."""
    message = (f"a worker exited with code {code} after the run finished (final/ was saved by then, so the run "
               f"is complete); its output is above")
    log(f"warning: {message}")
    write_outcome_file(outcome_path, replace(outcome, message=message))
