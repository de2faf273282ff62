"""REINFORCE Leave-One-Out on TRL's `RLOOTrainer`.

Each prompt's `num_generations` completions are scored by the reward functions; a completion's
advantage is its reward minus the mean reward of the prompt's other completions. Prompts, rewards
and the rollout engine are the on-policy stages' (`stages.on_policy`), as GRPO's are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError
from recipeforge.stages.on_policy import OnPolicyStage

if TYPE_CHECKING:
    from transformers import Trainer

    from recipeforge.config.schema.stage_recipes import RLOORecipe


class RLOOStage(OnPolicyStage):
    """RLOO on prompt rows with weighted reward functions."""

    stage = "rloo"
    section = "rloo"
    trainer_class = "trl.RLOOTrainer"
    recipe: RLOORecipe

    def build_trainer(self) -> Trainer:
        from recipeforge.components.rollout import prepare_rollout_trainer
        from recipeforge.outputs.atomic import crash_safe
        from trl import RLOOConfig, RLOOTrainer

        r = self.recipe.rloo
        rollout, engine, engine_trainer_args = self.rollout_setup()
        if engine_trainer_args:  # an engine that generates by itself (a rollout function)
            raise RecipeError(f"rollout engine '{rollout.engine}' generates through a rollout function here, "
                              f"which TRL's RLOOTrainer does not take ({', '.join(engine_trainer_args)})",
                              key="rloo.rollout.engine", location=self.ctx.locate(("rloo", "rollout", "engine")),
                              hint="use rollout.engine: hf, or train with stage: grpo")
        args = self.training_arguments(RLOOConfig, **self.on_policy_arguments(RLOOConfig),
                                       normalize_advantages=r.normalize_advantages,
                                       mask_truncated_completions=r.mask_truncated_completions, **engine)
        trainer = crash_safe(RLOOTrainer)(args=args, **self.trainer_inputs())
        prepare_rollout_trainer(rollout, trainer)
        return trainer
