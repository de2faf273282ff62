"""final/ of a trainer stage: the trained model with QAT's fake quantizers and fp8's float8 layers
swapped back for plain linear weights, written by the backend's saver (which may gather sharded
weights) or, with none, by rank 0 in the plan's final dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.stages.context import StageContext

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin, Trainer


def save_final_weights(ctx: StageContext, trainer: Trainer | None, model: PreTrainedModel,
                       files: PreTrainedTokenizerBase | ProcessorMixin) -> None:
    """Write `model` (unwrapped from `trainer`'s accelerator) and `files` (a tokenizer or a VLM's
    processor) to final/; every rank calls it (gathering is collective)."""
    if ctx.recipe.train.qat is not None:
        from recipeforge.components.qat import strip

        strip(model)  # plain nn.Linear weights in final/ (the fake quantizers hold no weights of their own)
    from recipeforge.stages import fp8

    if fp8.trains_fp8(ctx.plan):
        fp8.strip(model)  # plain nn.Linear weights in final/, unwrapped from the float8 all-gather
    if ctx.save_final is not None and trainer is not None:  # every rank: gathering is collective
        ctx.save_final(ctx, trainer, model, files)
    elif ctx.dist.is_main:
        from recipeforge.outputs.weights import save_pretrained_atomic
        from recipeforge.stages.precision import final_shard_bytes, final_weights_dtype

        save_pretrained_atomic(model, files, ctx.run.final, dtype=final_weights_dtype(ctx.recipe, ctx.plan),
                               max_shard_size=final_shard_bytes(ctx.recipe))
