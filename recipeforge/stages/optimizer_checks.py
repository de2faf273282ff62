"""The optimizer's library, checked before any data or weights load: torchao for its low-bit AdamW
(`stages.freezing.check_low_bit_optimizer`), bitsandbytes (on a CUDA GPU) for its 8-bit and paged
optimizers."""

from __future__ import annotations

from recipeforge.stages.context import StageContext


def check_optimizer_library(ctx: StageContext) -> None:
    """Refuse `train.optimizer` when the library it needs is missing here."""
    from recipeforge.stages.freezing import check_low_bit_optimizer
    from recipeforge.stages.trainer_args import BNB_OPTIMIZERS

    optimizer, location = ctx.recipe.train.optimizer, ctx.locate(("train", "optimizer"))
    check_low_bit_optimizer(optimizer, location=location)
    if optimizer in BNB_OPTIMIZERS:
        from recipeforge.components.adapters import check_bitsandbytes

        check_bitsandbytes(ctx.plan.device, what=f"optimizer {optimizer}", key="train.optimizer", location=location)
