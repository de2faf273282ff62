"""What a trainer stage refuses: before anything loads (`check_run`), settings this run cannot do on
its plan (a vision model on a text-only stage, activation offloading where it does not run, a low-bit
or stochastic-rounding optimizer without its library, QAT without torchao, fp8 without the hardware,
a micro batch below the stage's least);
once its data is prepared (`check_data`), a batch, step count or warmup the rows cannot give."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.stages.context import StageContext, quiet

if TYPE_CHECKING:
    from recipeforge.components.prepared import PreparedData


def check_run(ctx: StageContext, stage: str, *, takes_images: bool) -> None:
    """Refuse, before anything loads, what a run of `stage` cannot do on `ctx`'s plan; `takes_images`:
    whether the runner trains vision-language models."""
    from recipeforge.stages.precision import check_sr_optimizer

    recipe = ctx.recipe
    check_sr_optimizer(ctx.plan)
    if not takes_images:
        from recipeforge.plan.vision_stages import text_only_reason
        from recipeforge.stages.vision_check import refuse_vision

        # The plan refuses this when it read the model as a VLM; here, a model it could not read as one.
        refuse_vision(recipe, stage, why=text_only_reason(stage), location=ctx.locate(("stage",)))
    if recipe.train.activation_offloading:
        from recipeforge.stages.activation_offload import check_activation_offloading

        check_activation_offloading(stage, ctx.plan.device, location=ctx.locate(("train", "activation_offloading")))
    from recipeforge.stages.optimizer_checks import check_optimizer_library

    check_optimizer_library(ctx)  # torchao's low-bit AdamW, bitsandbytes' 8-bit optimizers
    if recipe.train.qat is not None:
        from recipeforge.components.qat import check_torchao

        check_torchao(location=ctx.locate(("train", "qat")))
    from recipeforge.stages import fp8

    fp8.check(ctx)  # train.precision fp8: torchao and float8 tensor cores on this device
    _check_micro_batch(ctx, stage)


def _check_micro_batch(ctx: StageContext, stage: str) -> None:
    """Refuse a plan whose micro batch is below the stage's least (`StageSpec.min_micro_batch`, KTO: 2).
    The recipe rules and the planner keep to it already; a plan made elsewhere (an edited plan.json) is
    still refused here, before any step."""
    from recipeforge.errors import RecipeError
    from recipeforge.stage_specs import stage_spec

    spec, micro = stage_spec(stage), ctx.plan.micro_batch_size
    if micro < spec.min_micro_batch:
        raise RecipeError(f"{spec.needs_rows}; the plan has {micro}", key="train.micro_batch_size",
                          location=ctx.locate(("train", "micro_batch_size")),
                          hint=f"set train.micro_batch_size: {spec.min_micro_batch} or more (a divisor of the "
                               "per-GPU batch)")


def check_data(ctx: StageContext, data: PreparedData) -> None:
    """Refuse a batch, step count or warmup the prepared `data` cannot give (before the model loads);
    the main process prints what it found."""
    from recipeforge.components.data_checks import check_data_numbers

    check_data_numbers(ctx.recipe, ctx.plan, data, log=ctx.log if ctx.dist.is_main else quiet)
