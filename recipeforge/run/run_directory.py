"""The run directory before training: refused, checked, locked, (re)written, and the checkpoint to
resume from. The main process of the main node does this, once, before any worker starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipeforge.components.data import DatasetRef, local_path, resolve_local, spec_base_dir
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs import checkpoint, run_lock
from recipeforge.outputs.preflight import check_output_location, planned_output, reports_write_errors
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan

DATA_SECTIONS = ("datasets", "eval_datasets")


@reports_write_errors
def prepare_run(loaded: LoadedRecipe, plan: Plan, run: RunDir, *, overwrite: bool, force: bool = False) -> Path | None:
    """Create (or check, or with `overwrite` wipe) the run directory and write the recipe, plan and
    environment; returns the checkpoint to resume from."""
    from recipeforge.outputs.library_warnings import warnings_to_run_dir
    from recipeforge.outputs.run_dir import prepare
    from recipeforge.outputs.run_guard import check_existing_run
    from recipeforge.outputs.services import check_services

    recipe = loaded.recipe
    # Everything that can refuse the run does so before the run directory is touched: the services the
    # recipe names (trackers, the Hub, a generation server), then whether its location can and may be
    # written (data paths resolved, so a folder inside a dataset is refused).
    check_services(recipe, loaded.tree.locate)
    check_location(loaded, plan, run, overwrite=overwrite)
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


def check_location(loaded: LoadedRecipe, plan: Plan, run: RunDir, *, overwrite: bool) -> None:
    """Refuse an output location the run cannot or must not write, before anything is written there."""
    base = Path(loaded.path).resolve().parent
    data = []
    for section in DATA_SECTIONS:
        for i, spec in enumerate(getattr(loaded.recipe.data, section)):
            ref = DatasetRef(spec, section, i)
            if any(ch in spec.path for ch in "*?["):  # a glob of stream shards: the folder its pattern starts in
                found = _glob_root(spec.path, spec_base_dir(ref, base, loaded.tree.locate))
            else:
                found = resolve_local(ref, base_dir=base, locate=loaded.tree.locate)
            if found is not None:
                data.append((ref.key, found))
    check_output_location(run.root, recipe_path=Path(loaded.path), datasets=data, overwrite=overwrite,
                          planned=planned_output(plan, loaded.recipe), log=log)


def _glob_root(pattern: str, base: Path | None) -> Path | None:
    """The existing folder a glob pattern's fixed part names (``shards/part-*.jsonl`` -> shards/), or None."""
    import glob

    fixed = Path(pattern.split("*")[0].split("?")[0].split("[")[0] or ".").expanduser()
    folder = fixed if str(pattern).endswith("/") or fixed.is_dir() else fixed.parent
    if not folder.is_absolute() and base is not None:
        folder = base / folder
    if not glob.has_magic(str(folder)) and folder.is_dir():
        return folder.resolve()
    return None


def resolved_for_run(loaded: LoadedRecipe, run: RunDir) -> dict[str, Any]:
    """The recipe as the run used it: every default filled in, secrets redacted, local data paths made
    absolute and `output.dir` pinned, so ``recipeforge train RUN/resolved_recipe.yaml`` works from
    anywhere and continues this run."""
    from recipeforge.components.chat_templates import is_template_path, template_file
    from recipeforge.config.dump import resolved_data

    data = resolved_data(loaded)
    base = Path(loaded.path).resolve().parent
    for section in DATA_SECTIONS:
        for i, spec in enumerate(getattr(loaded.recipe.data, section)):
            found = local_path(spec.path, spec_base_dir(DatasetRef(spec, section, i), base, loaded.tree.locate))
            if found is not None:
                data["data"][section][i]["path"] = str(found)
    template = loaded.recipe.data.chat_template
    if is_template_path(template):  # a .jinja file next to the recipe: absolute, like the data paths
        found = template_file(template, base_dir=base, location=loaded.tree.locate(("data", "chat_template")))
        if found is not None:
            data["data"]["chat_template"] = str(found)
    data["eval"]["tasks"] = [_local_task_path(task, base) for task in loaded.recipe.eval.tasks]
    data["output"]["dir"] = str(run.root)
    return data


def _local_task_path(task: str, base: Path) -> str:
    """A local eval task file (relative to the recipe) made absolute, like the data paths; a harness task
    name as it is."""
    from recipeforge.tools.evaluation.tasks import is_local

    path = Path(task).expanduser()
    if not is_local(task) or path.is_absolute() or not (base / path).is_file():
        return task
    return str((base / path).resolve())
