"""Group Relative Policy Optimization on TRL's `GRPOTrainer`.

Prompts, rewards and the rollout engine are the on-policy stages' (`stages.on_policy`); GRPO adds
its loss normalization and advantage scaling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.stages.on_policy import OnPolicyStage

if TYPE_CHECKING:
    from transformers import Trainer

    from recipeforge.config.schema.recipe import GRPORecipe


class GRPOStage(OnPolicyStage):
    """GRPO on prompt rows with weighted reward functions."""

    stage = "grpo"
    section = "grpo"
    trainer_class = "trl.GRPOTrainer"
    recipe: GRPORecipe

    def build_trainer(self) -> Trainer:
        from recipeforge.components.rollout import prepare_rollout_trainer
        from recipeforge.outputs.atomic import crash_safe
        from trl import GRPOConfig, GRPOTrainer

        g = self.recipe.grpo
        rollout, engine, engine_trainer_args = self.rollout_setup()
        args = self.training_arguments(GRPOConfig, **self.on_policy_arguments(GRPOConfig), loss_type=g.loss_type,
                                       scale_rewards=g.scale_rewards, **engine)
        trainer = crash_safe(GRPOTrainer)(args=args, **self.trainer_inputs(), **engine_trainer_args)
        prepare_rollout_trainer(rollout, trainer)
        return trainer
