"""Contrastive Preference Optimization, and SimPO, on TRL's `CPOTrainer`.

No reference model. `cpo.loss_type: simpo` is SimPO: length-normalized log-probabilities as rewards
and a target margin `simpo_gamma`; with it the NLL term on chosen answers (`cpo_alpha`) defaults to 0,
as in the SimPO paper, and to 1 for the CPO losses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.stages.trl_preference import PreferenceTrainerStage

if TYPE_CHECKING:
    from recipeforge.config.schema.preference import CPOConfig
    from recipeforge.config.schema.stage_recipes import CPORecipe


class CPOStage(PreferenceTrainerStage):
    """CPO or SimPO on prompt/chosen/rejected rows."""

    stage = "cpo"
    method = "CPO"
    trainer_class = "trl.experimental.cpo.CPOTrainer"
    recipe: CPORecipe

    @property
    def section(self) -> CPOConfig:
        return self.recipe.cpo

    def method_arguments(self) -> dict[str, Any]:
        c = self.section
        return {"beta": c.beta, "loss_type": c.loss_type, "simpo_gamma": c.simpo_gamma, "cpo_alpha": c.nll_weight,
                "label_smoothing": c.label_smoothing}
