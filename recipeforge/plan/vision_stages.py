"""What a vision-language model can be trained with, known from its config.json alone: the stages that
train one, and the refusals the plan makes (so `plan`, and `train` before anything is imported, loaded or
written, say it rather than the stage runner)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError
from recipeforge.stage_specs import Stage, stage_spec

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe

# The stages that train vision-language models (`stages.vision`).
VISION_STAGES = (Stage.SFT, Stage.DPO)

PACKING_WITH_IMAGES = ("packing is not possible with images: packed samples would share position ids and the image "
                       "grids of several samples, which vision-language models do not separate")


def text_only_reason(stage: str) -> str:
    """Why `stage` cannot train a vision-language model."""
    if stage_spec(stage).rollout:
        return "recipeforge's rollout engines and reward functions take text prompts only"
    return "its trainer takes text rows only"


def refuse_what_a_vlm_cannot_train(recipe: Recipe) -> None:
    """For a recipe whose model is a vision-language model: refuse a stage that trains text only, and
    packing (`RecipeError` at the key)."""
    stage = str(recipe.stage)
    if stage not in VISION_STAGES:
        raise RecipeError(f"stage {stage} cannot train the vision-language model '{recipe.model.name_or_path}': "
                          f"{text_only_reason(stage)}", key="stage",
                          hint=f"train vision-language models with stage: {' or stage: '.join(VISION_STAGES)}")
    if recipe.data.packing:
        raise RecipeError(PACKING_WITH_IMAGES, key="data.packing", hint="set data.packing: false")
