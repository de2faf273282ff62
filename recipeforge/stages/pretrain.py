"""Pretraining (or continued pretraining) on raw text: every token is trained, packing on by default."""

from __future__ import annotations

from recipeforge.stages.lm import LMStage


class PretrainStage(LMStage):
    """Causal-LM pretraining; the data formats decide that every token is a target."""

    stage = "pretrain"
