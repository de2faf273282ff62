"""Elastic restarts on the worker side: a worker group torch's elastic agent started again after one
of its workers failed (`distributed.max_restarts`).

The agent numbers the attempts of one launch in ``TORCHELASTIC_RESTART_COUNT`` (0: the first). A
restarted worker belongs to the same launch as the first attempt: the launching `recipeforge train`
still holds the run directory's lock, the run directory is this run's, and nothing is refused or
wiped again. What a restart does differently: rank 0 tidies what the failed attempt left (a
half-written checkpoint, checkpoints whose files do not match their manifest, metrics past the
checkpoint resumed from), chooses the newest intact checkpoint, and every rank resumes from its choice.
"""

from __future__ import annotations

import os
from pathlib import Path

from recipeforge.log import log
from recipeforge.outputs import checkpoint
from recipeforge.outputs.run_dir import RunDir
from recipeforge.stages.base import DistInfo

RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"


def restart_count() -> int:
    """Which restart of its launch this worker group is (0: the first attempt, or no elastic agent)."""
    raw = os.environ.get(RESTART_ENV, "0")
    return int(raw) if raw.isdecimal() else 0


def is_restart() -> bool:
    """Whether this worker was started again by the elastic agent after a failure."""
    return restart_count() > 0


def relock(run: RunDir) -> None:
    """Rank 0 of a restarted group started without a spec: the run directory is this launch's, so it is
    neither wiped (--overwrite) nor checked as another run's; it is locked for this attempt, and tidied
    before resuming (`resume_point`)."""
    from recipeforge.outputs import run_lock

    run_lock.acquire(run.root, log=log)


def exit_fault(rank: int) -> None:
    """`RECIPEFORGE_FAULT=exit:<rank>` (the spec's settings): kill that rank once its run has finished, in
    the first attempt of a launch only (a restarted group must not fail again)."""
    from recipeforge.outputs.atomic import maybe_fault

    if not is_restart():
        maybe_fault("exit", rank)


def finished_earlier(run: RunDir) -> bool:
    """A restart after the run had already finished (final/ is published atomically, after every
    rank's last step): a worker failed on its way out, and there is nothing left to train."""
    return is_restart() and run.final.is_dir()


def resume_point(resume: str, run: RunDir, dist: DistInfo) -> Path | None:
    """The checkpoint this worker resumes from (`output.resume`). On a restart, rank 0 tidies the run
    directory first (no launching process prepared it for this attempt) and every rank takes rank
    0's choice."""
    if not is_restart():
        return checkpoint.resume_checkpoint(resume, run.checkpoints)
    from recipeforge.backends import worker as w

    tidied = w.on_main(lambda: tidy_after_failure(resume, run), dist)
    chosen = w.broadcast(str(tidied) if tidied is not None else None)
    return Path(chosen) if chosen is not None else None


def tidy_after_failure(resume: str, run: RunDir) -> Path | None:
    """Rank 0 of a restarted group: drop what the failed attempt left half done, choose the checkpoint
    and cut metrics.jsonl after it; returns the checkpoint (None: start over)."""
    from recipeforge.outputs.metrics import MetricsWriter

    checkpoint.remove_incomplete(run.checkpoints)
    chosen = _choice(resume, run, verify=True)
    step = (checkpoint.step_of(chosen) or 0) if chosen is not None else 0
    redone = [s for s in _logged_train_steps(run) if s > step]
    if chosen is not None:
        MetricsWriter(run.metrics).truncate_after(step)
    elif run.metrics.exists():
        run.metrics.unlink()
    again = f"; steps {redone[0]}-{redone[-1]} run again" if redone else ""
    log(f"restart {restart_count()} of the worker group after a worker failed: "
        + (f"resuming from {chosen}{again}" if chosen is not None else f"no checkpoint yet, training from the start{again}"))
    return chosen


def _choice(resume: str, run: RunDir, *, verify: bool = False) -> Path | None:
    """`output.resume` on a restart: a named checkpoint gives way to a newer one this run saved since
    (the restart continues this launch, not the one it started from)."""
    if resume not in ("auto", "never"):
        newest = checkpoint.resume_checkpoint("auto", run.checkpoints, verify=verify, log=log)
        named = Path(resume).expanduser()
        if newest is not None and (checkpoint.step_of(newest) or 0) > (checkpoint.step_of(named) or 0):
            return newest
    return checkpoint.resume_checkpoint(resume, run.checkpoints, verify=verify, log=log if verify else None)


def _logged_train_steps(run: RunDir) -> list[int]:
    """The training steps metrics.jsonl holds (what a restart will log again)."""
    from recipeforge.outputs.metrics import read_metrics

    if not run.metrics.exists():
        return []
    return sorted({int(r["step"]) for r in read_metrics(run.metrics)
                   if r.get("split") == "train" and isinstance(r.get("step"), int)})
