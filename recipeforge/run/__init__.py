"""Entry points the CLI calls: `train`, `preprocess`, `merge`, `summary`.

A run, top to bottom (docs/architecture.md draws it):

- `run.launcher.launch` (the command a user types) plans, takes the run directory and its lock
  (`run.run_directory`), prepares the data, writes the worker spec and starts the processes through
  the backend's launcher; one process without a launcher trains in place (`run.in_place.train_here`).
- `run.worker.run_worker`, the one worker entry, runs every rank on a `WorkerSpec`: each launched
  process (``python -m recipeforge.run.worker RUN/worker.json``), the one process training in place,
  and each rank of ``torchrun -m recipeforge train`` / ``accelerate launch -m recipeforge train``
  (`run.direct`: rank 0 writes the spec and shares it). It runs the stage (`run.session.run_stage`:
  one immutable `StageContext`, the runner set up, trained and saved) and leaves a typed outcome.

Importing this package is cheap; torch, transformers, TRL and datasets load inside the functions
that need them. Rank 0 alone writes the run directory's files.
"""

from __future__ import annotations

from pathlib import Path

from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.plan.types import Plan
from recipeforge.run.finished import merge, summary
from recipeforge.run.network import network_guards
from recipeforge.run.options import LaunchFailed, LaunchOptions
from recipeforge.run.preprocessing import preprocess

__all__ = ["LaunchFailed", "LaunchOptions", "merge", "network_guards", "preprocess", "summary", "train"]


def train(loaded: LoadedRecipe, *, overwrite: bool = False, force: bool = False, plan: Plan | None = None,
          launch: LaunchOptions | None = None) -> Path | None:
    """Train `loaded`; returns the run directory (None for a dry run).

    Plans once (or takes `plan`) for the processes the command line asks for. One process trains
    here; more are started through the backend's launcher, each worker reading the spec written
    before launch. Started by a launcher itself (``torchrun -m recipeforge train``: RANK/WORLD_SIZE
    set), rank 0 writes the spec and every rank runs the worker entry on it (`run.direct`).
    """
    from recipeforge.run.worker_process import training_process
    from recipeforge.stages.context import DistInfo

    network_guards()
    dist = DistInfo.from_env()
    opts = launch or LaunchOptions()
    with training_process(dist, stops=dist.world_size > 1):
        if dist.world_size > 1:
            from recipeforge.run.direct import run_group

            return run_group(loaded, dist, opts, overwrite=overwrite, force=force)
        from recipeforge.run.launcher import launch as launch_run

        return launch_run(loaded, plan, opts, overwrite=overwrite, force=force)
