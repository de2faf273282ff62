"""The worker entry: every rank of every run, however it was started, runs `run_worker` on a `WorkerSpec`.

- ``python -m recipeforge.run.worker RUN/worker.json`` (`main`): each process torchrun or accelerate
  starts for `recipeforge train`, each Ray Train worker (`ray_entry`), each process of a Slurm or
  Kubernetes job (their per-node `recipeforge train` starts the launcher), each restart of an elastic
  group. The spec is read only if recipeforge wrote it for this user (`WorkerSpec.read_trusted`); the
  recipe is loaded as the launching command loaded it (its file, overrides and ``RECIPEFORGE_<SECTION>``
  values, all from the spec) and the launching command's settings are installed: a worker reads no
  ``RECIPEFORGE_*`` variable.
- In the launching process itself: one process trains in place (`run.in_place.train_here`), and each
  rank of ``torchrun -m recipeforge train`` / ``accelerate launch -m recipeforge train`` gets the spec
  its rank 0 wrote (`run.direct`); both call `run_worker` with the recipe they already loaded.

`RECIPEFORGE_FAULT=exit:<rank>` (given to the launching command, carried in the spec's settings) kills
that rank of a launched job once the run has finished (after its outcome is written), so the launching
command's answer to a worker that ends badly after the final save can be tested.

With `distributed.max_restarts`, torch's elastic agent starts the whole group again after a worker
fails; each restarted worker resumes from the newest complete checkpoint (`run.restarts`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from recipeforge.backends.worker_spec import WorkerSpec
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.run.rank import run_worker
from recipeforge.settings import installed
from recipeforge.stages.context import DistInfo

__all__ = ["load_spec_recipe", "main", "run_worker"]

USAGE = "usage: python -m recipeforge.run.worker RUN/worker.json (written by `recipeforge train`)"


def load_spec_recipe(spec: WorkerSpec) -> LoadedRecipe:
    """The recipe as the launching command loaded it: its file and overrides, its ``RECIPEFORGE_<SECTION>``
    values from the spec (none from this process's environment), the rest of the environment for
    ``${env:...}`` references."""
    import os

    from recipeforge.config import load_recipe

    environ = {k: v for k, v in os.environ.items() if not k.startswith("RECIPEFORGE_")}
    with installed(spec.settings):  # the code opt-in the recipe's checks ask about is the spec's
        return load_recipe(spec.recipe, list(spec.overrides), environ={**environ, **spec.recipe_env})


def reported_load(spec: WorkerSpec, dist: DistInfo) -> LoadedRecipe:
    """`load_spec_recipe`; a recipe this worker cannot load (its environment differs from the launching
    command's) is reported in the outcome, as any user error a worker finds."""
    from recipeforge.backends.worker_spec import Outcome, OutcomeKind, write_outcome
    from recipeforge.errors import RecipeError

    try:
        return load_spec_recipe(spec)
    except RecipeError as exc:
        if dist.is_main:
            write_outcome(spec, Outcome(OutcomeKind.USER_ERROR.value, exc.render(), rank=dist.rank))
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m recipeforge.run.worker SPEC``: run this process's rank; its exit code (a user error 2,
    a stop 0: the launching command reports both, from the outcome this rank left)."""
    from recipeforge import start_up
    from recipeforge.run.network import network_guards
    from recipeforge.run.worker_process import exit_code, training_process

    if argv is None:  # the process's own entry: its start-up out of the collector's way (`start_up`)
        start_up.pause()
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    network_guards()
    loaded: LoadedRecipe | None = None
    spec: WorkerSpec | None = None
    try:
        spec = WorkerSpec.read_trusted(Path(args[0]).absolute())
        dist = DistInfo.from_env()
        loaded = reported_load(spec, dist)
        with installed(spec.settings), training_process(dist, stops=True):
            run_worker(spec, loaded, dist)
    except BaseException as exc:  # noqa: BLE001 - every ending becomes an exit code and a short message
        return exit_code(exc, loaded, debug=spec.settings.debug if spec is not None else False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
