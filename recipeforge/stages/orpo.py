"""Odds Ratio Preference Optimization on TRL's `ORPOTrainer`.

ORPO adds an odds-ratio term, weighted by `orpo.beta`, to the SFT loss on the chosen answers: one
stage instead of SFT then DPO, and no reference model (LoRA or full fine-tuning alike).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.stages.trl_preference import PreferenceTrainerStage

if TYPE_CHECKING:
    from recipeforge.config.schema.preference import ORPOConfig
    from recipeforge.config.schema.stage_recipes import ORPORecipe


class ORPOStage(PreferenceTrainerStage):
    """ORPO on prompt/chosen/rejected rows."""

    stage = "orpo"
    method = "ORPO"
    trainer_class = "trl.experimental.orpo.ORPOTrainer"
    recipe: ORPORecipe

    @property
    def section(self) -> ORPOConfig:
        return self.recipe.orpo

    def method_arguments(self) -> dict[str, Any]:
        return {"beta": self.section.beta}
