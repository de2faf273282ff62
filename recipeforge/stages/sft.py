"""Supervised fine-tuning: loss on assistant/completion tokens only, unless `data.train_on_inputs`."""

from __future__ import annotations

from recipeforge.stages.lm import LMStage


class SFTStage(LMStage):
    """SFT on alpaca, messages, completion or text rows; the masking is done at tokenization
    (`components.lm_data`, prompt tokens get label -100)."""

    stage = "sft"
