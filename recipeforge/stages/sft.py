"""Supervised fine-tuning: loss on assistant/completion tokens only, unless `data.train_on_inputs`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.stages.lm import LMStage

if TYPE_CHECKING:
    from recipeforge.stages.base import TrainerStage
    from recipeforge.stages.context import RecipeContext


class SFTStage(LMStage):
    """SFT on alpaca, messages, completion or text rows; the masking is done at tokenization
    (`components.lm_data`, prompt tokens get label -100)."""

    stage = "sft"

    # A `VisionSFTStage` is no SFTStage: the runner made is a TrainerStage.
    def __new__(cls, ctx: RecipeContext, *args: Any, **kwargs: Any) -> TrainerStage:  # type: ignore[misc]
        # A vision-language model trains on TRL's SFTTrainer with its processor (`stages.vision`).
        from recipeforge.stages.vision_check import is_vision_recipe

        if cls is SFTStage and is_vision_recipe(ctx.recipe):
            from recipeforge.stages.vision import VisionSFTStage

            return VisionSFTStage(ctx)
        return super().__new__(cls)
