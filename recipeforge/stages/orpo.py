"""Odds Ratio Preference Optimization on TRL's `ORPOTrainer`.

ORPO adds an odds-ratio term, weighted by `orpo.beta`, to the SFT loss on the chosen answers: one
stage instead of SFT then DPO, and no reference model (LoRA or full fine-tuning alike).
"""

from __future__ import annotations

from recipeforge.stages.trl_preference import PreferenceTrainerStage


class ORPOStage(PreferenceTrainerStage):
    """ORPO on prompt/chosen/rejected rows."""

    stage = "orpo"
    method = "ORPO"
    trainer_class = "trl.experimental.orpo.ORPOTrainer"

    def method_arguments(self) -> dict:
        return {"beta": self.section.beta}
