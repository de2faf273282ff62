"""How a worker's job ended, left next to its spec for the launching command (`worker_spec.Outcome`)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from recipeforge.backends import worker as w
from recipeforge.backends.worker_spec import Outcome, OutcomeKind, WorkerSpec, write_outcome
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.errors import RecipeError, locate_problems
from recipeforge.stages.context import DistInfo
from recipeforge.stages.preemption import Preempted


@contextmanager
def reported_outcome(spec: WorkerSpec, dist: DistInfo, loaded: LoadedRecipe) -> Iterator[None]:
    """How the job ended, left next to the spec for the launching command: finished (rank 0),
    preempted (first local rank, after every rank left the process group together), a user error
    (rank 0), out of memory or a diverged loss (any rank). A spec without an outcome file (the
    launching command is this process) gets nothing written."""
    from recipeforge.plan.oom import OutOfMemory
    from recipeforge.stages.divergence import Diverged

    try:
        yield
    except Preempted as stop:
        w.finish()  # every rank stopped at the same step
        if dist.local_rank == 0:
            write_outcome(spec, Outcome(OutcomeKind.PREEMPTED.value, stop.describe(), stop.to_dict(), dist.rank))
        raise
    except RecipeError as exc:
        kind = (OutcomeKind.OUT_OF_MEMORY if isinstance(exc, OutOfMemory)
                else OutcomeKind.DIVERGED if isinstance(exc, Diverged) else OutcomeKind.USER_ERROR)
        if dist.is_main or kind != OutcomeKind.USER_ERROR:
            located = locate_problems(exc, loaded.tree.locate)
            write_outcome(spec, Outcome(kind.value, located.render(), rank=dist.rank))
        raise
    if dist.is_main:
        write_outcome(spec, Outcome(OutcomeKind.FINISHED.value, rank=dist.rank))
