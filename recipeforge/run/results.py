"""The main process's files once its stage has trained: merged weights, loss plot, model card, backend.json."""

from __future__ import annotations

import json
from dataclasses import asdict

from recipeforge.backends.base import Backend
from recipeforge.run.resolved import resolved_for_run
from recipeforge.stages.base import TrainerStage
from recipeforge.stages.context import StageContext


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
