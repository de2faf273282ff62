"""Whether a recipe's model is a vision-language model, read from its config.json alone, and the
refusal of the stages that cannot train one. Kept apart from `stages.vision` (which builds on
`stages.base`) so that `stages.base` can ask it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.errors import Location, RecipeError
from recipeforge.plan.vision_stages import VISION_STAGES

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe


def is_vision_recipe(recipe: Recipe) -> bool:
    """Whether the recipe's model is a VLM, from its config.json alone (tiny spec, local file,
    catalog, or the hub's config when reachable); False when no config can be read."""
    from recipeforge.components.vision_model import is_vision_config
    from recipeforge.plan.catalog import architecture_config

    try:
        return is_vision_config(architecture_config(recipe.model.name_or_path, recipe.model.revision))
    except (RecipeError, OSError, ValueError):
        return False


def refuse_vision(recipe: Recipe, stage: str, *, why: str, location: Location | None = None) -> None:
    """A stage that cannot train a VLM refuses one, before anything loads."""
    if is_vision_recipe(recipe):
        raise RecipeError(f"stage {stage} cannot train the vision-language model '{recipe.model.name_or_path}': "
                          f"{why}", key="stage", location=location,
                          hint=f"train vision-language models with stage: {' or stage: '.join(VISION_STAGES)}")
