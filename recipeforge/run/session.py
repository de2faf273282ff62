"""One process running the stage: its immutable context built, the stage set up, trained and saved,
and the main process's files written after (merged weights, loss plot, model card, backend.json)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from recipeforge.backends import worker as w
from recipeforge.backends.base import Backend
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs.preflight import reports_write_errors
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan
from recipeforge.run.run_directory import resolved_for_run
from recipeforge.stages.base import DistInfo, StageContext, TrainerStage


@reports_write_errors
def run_stage(loaded: LoadedRecipe, plan: Plan, run: RunDir, backend: Backend, dist: DistInfo,
              resume_from: Path | None) -> None:
    """Run the stage on `backend` in this process (one rank, or the only process)."""
    from recipeforge.outputs.library_warnings import warnings_to_run_dir

    if plan.device != "cuda":
        from recipeforge.backends.launch import cpu_engine_env

        os.environ.update(cpu_engine_env())
    warnings_to_run_dir(run.root)
    ctx = stage_context(loaded, plan, run, backend, dist, resume_from)
    runner = trained_runner(ctx, backend)
    if dist.is_main:
        write_results(ctx, runner, backend)


def stage_context(loaded: LoadedRecipe, plan: Plan, run: RunDir, backend: Backend, dist: DistInfo,
                  resume_from: Path | None) -> StageContext:
    """The one context of this worker: the backend sets itself up on a first one (`setup_worker`),
    and its hooks and trainer arguments complete the context the stage gets."""
    ctx = StageContext(loaded=loaded, plan=plan, run=run, resume_from=resume_from, dist=dist,
                       save_final=backend.save_final, barrier=w.barrier if dist.world_size > 1 else _no_wait)
    hooks = backend.setup_worker(ctx)
    ctx = replace(ctx, hooks=hooks)
    return replace(ctx, backend_kwargs=dict(backend.trainer_kwargs(ctx)))


def _no_wait() -> None:
    """One process: nobody to wait for."""


def trained_runner(ctx: StageContext, backend: Backend) -> Any:
    """The stage's runner, set up, trained and saved; running out of memory is answered with the
    plan's numbers and what would fit, as any recipe that does not fit is."""
    from recipeforge.outputs.metrics import MetricsWriter
    from recipeforge.stages import runner_class
    from recipeforge.stages.oom import is_out_of_memory, out_of_memory_error

    runner = runner_class(ctx.recipe.stage, backend.runner(ctx.recipe.stage))(ctx)
    if ctx.dist.world_size > 1:
        # One process per machine tokenizes and caches the data first (a cache hit when `recipeforge
        # train` built it before launching); the others poll for it outside any collective, then read it
        # in `setup`.
        from recipeforge.backends.data_ready import prepare_on_first_rank

        prepare_on_first_rank(lambda: runner, ctx.dist, broadcast=w.broadcast, barrier=w.barrier, log=ctx.log)
    from recipeforge.outputs import phase_memory

    phase_memory.start(ctx.run.root, ctx.dist.rank)  # phase_memory/rank<N>.json: each phase's peak
    try:
        with phase_memory.phase("load"):
            runner.setup()
        if ctx.dist.is_main and runner.data_stats:
            MetricsWriter(ctx.run.metrics).write({"split": "data", "step": 0, **runner.data_stats})
        load_seconds = getattr(runner, "model_load_seconds", None)
        if ctx.dist.is_main and load_seconds is not None:
            # How long the model took to build or read before the first step (random init included).
            MetricsWriter(ctx.run.metrics).write({"split": "startup", "step": 0,
                                                  "model_load_s": round(load_seconds, 3)})
        with phase_memory.phase("train"):
            runner.train()
        if ctx.dist.is_main and backend.reports_runtime:
            write_backend_report(ctx, runner, backend)
        with phase_memory.phase("save"):
            runner.save()
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise out_of_memory_error(ctx, runner, exc) from None
    return runner


def write_results(ctx: StageContext, runner: TrainerStage, backend: Backend) -> None:
    """The main process's files after training: merged weights, loss.png and the model card."""
    from recipeforge.tools.model_card import write_model_card
    from recipeforge.tools.report import write_loss_plot

    # A backend exporting final/ after the job (Megatron) merges there (`finish_launch`).
    if ctx.recipe.output.merge_adapter and ctx.recipe.adapter.type != "none" and not backend.exports_after_job:
        from recipeforge.outputs import phase_memory
        from recipeforge.outputs.merge import merge_adapter

        with phase_memory.phase("merge"):
            merge_adapter(ctx.run.root)
    write_loss_plot(ctx.run.root, log=ctx.log)  # loss.png, which the model card shows
    write_model_card(ctx.run.readme, recipe=ctx.recipe, recipe_data=resolved_for_run(ctx.loaded, ctx.run),
                     plan=ctx.plan, data_stats=runner.data_stats, run_dir=ctx.run.root,
                     adapter=ctx.recipe.adapter.type != "none")


def write_backend_report(ctx: StageContext, runner: TrainerStage, backend: Backend) -> None:
    """backend.json: what ran, observed from inside the (main) worker, next to what was planned."""
    from recipeforge.outputs.run_dir import _atomic_write

    report = {"planned": {"backend": ctx.plan.backend, "preset": ctx.plan.preset, "world_size": ctx.plan.world_size,
                          "backend_part": asdict(ctx.plan.backend_part)},
              "observed": backend.runtime_report(runner.trainer) if runner.trainer is not None else {}}
    _atomic_write(ctx.run.root / "backend.json", json.dumps(report, indent=2, default=str) + "\n")


def evaluate_after_training(loaded: LoadedRecipe, run_root: Path) -> None:
    """`eval.tasks` with `eval.after_training`: evaluate the saved model (`tools.evaluation`) before it
    is pushed, so the card uploaded holds the scores. A user error (lm-eval missing, a bad task) is
    logged and leaves the run complete: `recipeforge eval RUN_DIR` retries."""
    section = loaded.recipe.eval
    if not section.tasks or not section.after_training:
        return
    from recipeforge.errors import RecipeError
    from recipeforge.tools.evaluation.command import options_for, refresh_card
    from recipeforge.tools.evaluation.runner import evaluate_run

    options = options_for(section.model_dump(), batch_size=None, limit=None, device=None)
    _free_training_memory()
    from recipeforge.outputs.merge import whole_model_loading

    try:
        with whole_model_loading():  # a ZeRO-3 worker's process: the model loads whole, without its peers
            done = evaluate_run(run_root, list(section.tasks), Path(loaded.path).resolve().parent, options,
                                log=log, checkpoints=section.at_checkpoints, allow_code=loaded.recipe.allow_code,
                                key="eval.tasks")
    except RecipeError as exc:
        import shlex

        from recipeforge.registry import code_trust

        # The retry runs the same tasks with the same trust: --trust-code when this run had it by flag.
        trust = ["--trust-code"] if code_trust(False)[0] else []
        again = shlex.join(["recipeforge", *trust, "eval", str(run_root),
                            *(["--checkpoints"] if section.at_checkpoints else [])])
        log(f"warning: evaluation skipped: {exc.render()}\n  the run is complete; evaluate it with: {again}")
        return
    refresh_card(run_root)
    for subject, records in done.items():
        for name, record in records.items():
            log(f"eval {subject} {name}: " + ", ".join(f"{k} {v}" for k, v in record["scores"].items()))


def _free_training_memory() -> None:
    """A run trained in this process leaves its trainer (model, optimizer states) to the collector:
    collected before the model is loaded again for evaluation, and the GPU's cached blocks released."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def push_to_hub(loaded: LoadedRecipe, run_root: Path) -> None:
    """`output.push_to_hub`: upload the saved model once the run is complete (`tools.hub`). A failed
    upload raises `tools.hub.PushFailed`; the run directory is already complete then."""
    hub = loaded.recipe.output.push_to_hub
    if hub is None:
        return
    from recipeforge.tools.hub import push

    log(f"pushing the model to the Hub: {hub.repo_id}")
    log(f"pushed: {push(run_root, hub.repo_id, private=hub.private, log=log)}")
