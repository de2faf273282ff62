"""Group Relative Policy Optimization on TRL's `GRPOTrainer`.

Prompts, rewards and the rollout engine are the on-policy stages' (`stages.on_policy`); GRPO adds
its loss normalization and advantage scaling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.stages.on_policy import OnPolicyStage

if TYPE_CHECKING:
    from transformers import Trainer

    from recipeforge.config.schema.stage_recipes import GRPORecipe


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
        tools: dict[str, Any] = {}
        if g.environment is not None:
            # TRL's tool loop: at most max_turns tool turns per episode, tool results out of the loss.
            engine = {**engine, "max_tool_calling_iterations": g.environment.max_turns}
            tools["environment_factory"] = self.environment
        args = self.training_arguments(GRPOConfig, **self.on_policy_arguments(GRPOConfig), loss_type=g.loss_type,
                                       scale_rewards=g.scale_rewards, **engine)
        trainer = crash_safe(GRPOTrainer)(args=args, **self.trainer_inputs(), **engine_trainer_args, **tools)
        prepare_rollout_trainer(rollout, trainer)
        if g.environment is not None:
            from recipeforge.stages.tool_episodes import record_episodes

            ctx = self.context
            record_episodes(trainer, ctx.run.logs / "episodes.jsonl", is_main=ctx.dist.is_main)
        return trainer
