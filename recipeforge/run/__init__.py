"""Entry points the CLI calls: `train`, `preprocess`, `merge`, `summary`.

A run, top to bottom (docs/architecture.md draws it):

- `run.launcher.launch` (the command a user types) plans, takes the run directory and its lock
  (`run.run_directory`), prepares the data, writes the worker spec and starts the processes through
  the backend's launcher; one process without a launcher trains in place (`launcher.train_here`).
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
from typing import Any

from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.plan.types import Plan
from recipeforge.run.network import network_guards
from recipeforge.run.options import LaunchFailed, LaunchOptions

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


def preprocess(loaded: LoadedRecipe) -> dict[str, Any]:
    """Build the tokenized-data cache of a pretrain/SFT recipe ahead of training; returns statistics.

    DPO and GRPO data are tokenized by their trainers; for them the rows are read, remapped and
    checked, and their counts returned.
    """
    from recipeforge.components.data_checks import check_data_numbers
    from recipeforge.log import log
    from recipeforge.outputs.services import check_services
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import RecipeContext

    network_guards()
    check_services(loaded.recipe, loaded.tree.locate, downloads_only=True)
    data = runner_class(loaded.recipe.stage)(RecipeContext(loaded=loaded)).prepare()
    check_data_numbers(loaded.recipe, None, data, log=log)  # against the recipe's own global batch
    stats = dict(data.stats)
    if data.cache_path is not None:
        stats["cache_path"] = str(data.cache_path)
        stats["fingerprint"] = data.fingerprint
    return stats


def merge(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Merge the LoRA adapter of a finished run into its base model (safetensors); returns the folder
    (default ``RUN_DIR/merged``)."""
    from recipeforge.outputs.merge import merge_adapter
    from recipeforge.outputs.preflight import output_write_failure

    try:
        return merge_adapter(Path(run_dir), Path(out_dir) if out_dir is not None else None)
    except Exception as exc:  # a full disk, a read-only mount: said about the merged folder and its disk
        failure = output_write_failure(exc, Path(out_dir) if out_dir is not None else Path(run_dir) / "merged",
                                       what="the merged model")
        if failure is None:
            raise
        raise failure from None


def summary(run_dir: Path) -> dict[str, Any]:
    """First and last value of the main metrics of a finished run (for the CLI to print)."""
    from recipeforge.outputs.metrics import read_metrics, series
    from recipeforge.stage_specs import REPORTED_METRICS

    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    out = {}
    for key in REPORTED_METRICS:
        values = series(records, key)
        if values:
            out[key] = {"first": values[0], "last": values[-1]}
    return out
