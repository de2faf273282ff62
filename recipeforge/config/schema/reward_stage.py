"""`reward:` — the settings of Bradley-Terry reward-model training (TRL RewardTrainer).

Everything else a reward run needs is carried by the common sections: the model (loaded with a
one-output sequence-classification head), `data.sequence_len` (longest chosen or rejected sequence),
`data.truncation` (cut or drop longer pairs), `data.chat_template`, and the `adapter:` section.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from recipeforge.config.schema.base import Section


class RewardModelConfig(Section):
    """Reward-model training (TRL RewardTrainer, Bradley-Terry loss) on `preference` data, whose optional numeric `margin` column adds a margin term; the run's final/ or merged/ serves as a GRPO `reward_model` reward."""

    center_rewards_coefficient: Optional[float] = Field(
        None, ge=0,
        description="Weight of an extra loss term, the mean of (r_chosen + r_rejected)^2, that keeps rewards "
                    "centred on zero (Eisenstein et al. 2023, Eq. 2; 0.01 is the usual value). null: no such term.")
    disable_dropout: bool = Field(
        True, description="Switch off the model's dropout while training, so chosen and rejected are scored "
                          "by the same network.")
