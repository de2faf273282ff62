"""Entry points the CLI calls: `train`, `preprocess`, `merge`.

Importing this module is cheap; torch, transformers, TRL and datasets load inside the functions
that need them. Inside a process started by ``accelerate launch -m recipeforge train ...`` or
torchrun (RANK/WORLD_SIZE set), `train` runs as that worker and never relaunches; rank 0 alone
writes the run directory's files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from recipeforge.errors import RecipeError


def train(loaded, *, overwrite: bool = False, plan=None) -> Path:
    """Train `loaded` (a `config.LoadedRecipe`); returns the run directory.

    Plans once (or takes `plan`), writes resolved_recipe.yaml / plan.json / environment.json,
    resumes from the newest complete checkpoint when `output.resume` allows, runs the stage, and
    writes final/, merged/ (if asked) and the model card.
    """
    from recipeforge.outputs import checkpoint
    from recipeforge.outputs.metrics import MetricsWriter
    from recipeforge.outputs.run_dir import RunDir, default_run_dir, prepare
    from recipeforge.stages.base import DistInfo, StageContext, _log

    recipe = loaded.recipe
    dist = DistInfo.from_env()
    # In a launched job the launching command planned and prepared (or wiped) the run directory;
    # workers read its plan and never wipe what the other ranks are reading.
    launched = dist.world_size > 1
    overwrite = overwrite and not launched
    _network_guards()
    run = RunDir(default_run_dir(recipe, Path(loaded.path)).absolute())
    # Everything that can refuse the run does so before the run directory is touched.
    if plan is None:
        plan = _read_plan(run.plan) if launched and run.plan.is_file() else _make_plan(recipe)
    if dist.is_main:
        if not overwrite:
            _check_same_run(run, loaded)
        if recipe.output.resume not in ("auto", "never"):
            checkpoint.resume_checkpoint(recipe.output.resume, run.checkpoints)
        prepare(run, overwrite=overwrite, resume=recipe.output.resume)
        checkpoint.remove_incomplete(run.checkpoints)
    resume_from = checkpoint.resume_checkpoint(recipe.output.resume, run.checkpoints)
    if dist.is_main:
        run.write_recipe(_resolved_for_run(loaded, run), Path(loaded.path))
        run.write_plan(plan)
        run.write_environment()
        writer = MetricsWriter(run.metrics)
        if resume_from is not None:
            writer.truncate_after(checkpoint.step_of(resume_from) or 0)
            _log(f"resuming from {resume_from}")
        elif run.metrics.exists():
            run.metrics.unlink()
    ctx = StageContext(loaded=loaded, plan=plan, run=run, resume_from=resume_from, dist=dist)
    runner = _run_stage(ctx)
    if dist.is_main:
        if recipe.output.merge_adapter and recipe.adapter.type != "none":
            from recipeforge.outputs.export import merge_adapter

            merge_adapter(run.root)
        _write_card(ctx, runner)
    _log(f"done: {run.root}")
    return run.root


def _run_stage(ctx):
    from recipeforge.outputs.metrics import MetricsWriter
    from recipeforge.stages import runner_class

    runner = runner_class(ctx.recipe.stage)(ctx)
    runner.setup()
    if ctx.dist.is_main and runner.data_stats:
        MetricsWriter(ctx.run.metrics).write({"split": "data", "step": 0, **runner.data_stats})
    runner.train()
    runner.save()
    return runner


def preprocess(loaded) -> dict:
    """Build the tokenized-data cache of a pretrain/SFT recipe ahead of training; returns statistics.

    DPO and GRPO data are tokenized by their trainers; for them the rows are read, remapped and
    checked, and their counts returned.
    """
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import StageContext

    recipe = loaded.recipe
    _network_guards()
    runner = runner_class(recipe.stage)(StageContext(loaded=loaded, plan=None, run=None))
    runner.tokenizer = runner.load_tokenizer()
    runner.prepare_data()
    stats = dict(runner.data_stats)
    data = getattr(runner, "data", None)
    if data is not None and getattr(data, "cache_path", None) is not None:
        stats["cache_path"] = str(data.cache_path)
        stats["fingerprint"] = data.fingerprint
    return stats


def merge(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Merge the LoRA adapter of a finished run into its base model (safetensors); returns the folder
    (default ``RUN_DIR/merged``)."""
    from recipeforge.outputs.export import merge_adapter

    return merge_adapter(Path(run_dir), Path(out_dir) if out_dir is not None else None)


def _make_plan(recipe):
    from recipeforge.plan import make_plan

    return make_plan(recipe)


def _read_plan(path: Path):
    """The plan the launching command wrote (launched workers never plan again)."""
    from recipeforge.plan.types import Choice, Plan

    raw = json.loads(path.read_text())
    raw["reasons"] = {k: Choice(**v) if isinstance(v, dict) else v for k, v in raw.get("reasons", {}).items()}
    return Plan(**raw)


def _network_guards() -> None:
    """No telemetry of any kind, from any library, set before they are imported (they read it once).

    Hub access itself is left alone: a tiny model with local data never asks the hub for anything,
    and forcing offline mode would break hub ids for anything later in the same process.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def _resolved_for_run(loaded, run) -> dict:
    """The recipe as the run used it: every default filled in, secrets redacted, local data paths made
    absolute and `output.dir` pinned, so ``recipeforge train RUN/resolved_recipe.yaml`` works from
    anywhere and continues this run."""
    from recipeforge.components.data import DatasetRef, local_path, spec_base_dir
    from recipeforge.config.dump import resolved_data

    data = resolved_data(loaded)
    base = Path(loaded.path).resolve().parent
    for section in ("datasets", "eval_datasets"):
        for i, spec in enumerate(getattr(loaded.recipe.data, section)):
            found = local_path(spec.path, spec_base_dir(DatasetRef(spec, section, i), base, loaded.tree.locate))
            if found is not None:
                data["data"][section][i]["path"] = str(found)
    data["output"]["dir"] = str(run.root)
    return data


def _check_same_run(run, loaded) -> None:
    """Refuse to continue a run directory that belongs to a different recipe (model, data, stage)."""
    import yaml

    if not run.resolved_recipe.is_file() or not run.has_results():
        return
    try:
        old = yaml.safe_load(run.resolved_recipe.read_text()) or {}
    except yaml.YAMLError:
        return
    from recipeforge.config.dump import resolved_data

    new = resolved_data(loaded)
    for key in ("stage", "model", "adapter"):
        if old.get(key) != new.get(key):
            raise RecipeError(f"run directory {run.root} holds a run of a different recipe ({key} differs)",
                              key="output.dir",
                              hint="pass --overwrite to start over, or set output.dir to a new directory")


def _write_card(ctx, runner) -> None:
    from recipeforge.outputs.model_card import write_model_card

    recipe_data = _resolved_for_run(ctx.loaded, ctx.run)
    write_model_card(ctx.run.readme, recipe=ctx.recipe, recipe_data=recipe_data, plan=ctx.plan,
                     data_stats=runner.data_stats, run_dir=ctx.run.root,
                     adapter=ctx.recipe.adapter.type != "none")


def summary(run_dir: Path) -> dict[str, Any]:
    """First and last value of the main metrics of a finished run (for the CLI to print)."""
    from recipeforge.outputs.metrics import read_metrics, series

    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    out = {}
    for key in ("loss", "eval_loss", "rewards/accuracies", "rewards/margins", "reward"):
        values = series(records, key)
        if values:
            out[key] = {"first": values[0], "last": values[-1]}
    return out
