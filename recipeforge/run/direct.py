"""A worker group a launcher started on `recipeforge train` itself (``torchrun -m recipeforge train x.yaml``,
``accelerate launch -m recipeforge train x.yaml``): no launching command wrote a spec, so rank 0 plans
for the launcher's world, prepares the run directory, writes the spec into it and sends it to every
rank over the process group (the nodes need not share a filesystem); then every rank runs the worker
entry (`run.worker.run_worker`) on it, as a launched worker does.
"""

from __future__ import annotations

import json
from pathlib import Path

from recipeforge.backends import worker as w
from recipeforge.backends.worker_spec import SPEC_NAME, WorkerSpec
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.outputs.run_dir import RunDir, default_run_dir
from recipeforge.plan.types import Plan
from recipeforge.run import restarts
from recipeforge.run.after import finish_run
from recipeforge.run.options import LaunchOptions
from recipeforge.run.rank import run_worker
from recipeforge.run.run_directory import prepare_run
from recipeforge.run.spec import spec_for
from recipeforge.stages.context import DistInfo


def run_group(loaded: LoadedRecipe, dist: DistInfo, opts: LaunchOptions, *, overwrite: bool, force: bool) -> Path:
    """This rank of a group started without a spec; returns the run directory."""
    run = RunDir(default_run_dir(loaded.recipe, Path(loaded.path)).absolute())
    plan = w.group_plan(loaded.recipe, dist)
    # Rank 0 reads back the file it wrote, as a launched worker would; the others check what it sent.
    mine = w.on_main(lambda: _prepare(loaded, plan, run, opts, overwrite=overwrite, force=force), dist)
    shared = w.broadcast(mine.to_json() if mine is not None else None)
    assert shared is not None  # rank 0 wrote it (`on_main` raised on every rank otherwise)
    spec = mine or WorkerSpec.from_dict(json.loads(shared), "the worker spec rank 0 sent")
    root = run_worker(spec, loaded, dist)
    if dist.is_main:  # no launching command: rank 0 evaluates and pushes
        finish_run(loaded, plan, run)
    return root


def _prepare(loaded: LoadedRecipe, plan: Plan, run: RunDir, opts: LaunchOptions, *, overwrite: bool,
             force: bool) -> WorkerSpec:
    """Rank 0: the run directory ready (or, on an elastic restart of the same launch, locked again) and
    the spec written; returns it as read back from its file."""
    if restarts.is_restart():
        restarts.relock(run)
        run.write_plan(plan)  # this attempt's plan (the same launch plans the same)
    else:
        prepare_run(loaded, plan, run, overwrite=overwrite, force=force)
    path = run.root / SPEC_NAME
    spec_for(loaded, opts, plan_path=run.plan, run_dir=run.root, outcome=None).write(path)
    try:
        return WorkerSpec.read_trusted(path)
    finally:
        # The other ranks get the spec over the process group; its overrides and environment values may
        # hold credentials, which the run directory must not keep.
        path.unlink(missing_ok=True)
