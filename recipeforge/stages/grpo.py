"""Group Relative Policy Optimization on TRL's `GRPOTrainer`.

Completions come from the rollout engine the recipe names (`hf`: the policy's own `generate`);
rewards come from the rewards registry, and the dataset's extra columns reach them as keyword
arguments. The trainer logs each reward function's mean as ``rewards/<name>/mean``.
"""

from __future__ import annotations

import atexit
import json
from typing import TYPE_CHECKING, Any

from recipeforge.components.prepared import PreparedData
from recipeforge.stages.base import TrainerStage

if TYPE_CHECKING:
    from transformers import Trainer

    from recipeforge.components.rewards import BuiltRewards
    from recipeforge.components.rollout import RunningServer
    from recipeforge.config.schema.recipe import GRPORecipe
    from recipeforge.config.schema.stages import RolloutConfig


class GRPOStage(TrainerStage):
    """GRPO on prompt rows with weighted reward functions."""

    stage = "grpo"
    trainer_class = "trl.GRPOTrainer"
    recipe: GRPORecipe
    server: RunningServer | None = None  # the generation server this run started (server mode with launch: true)
    # Set by `prepare_data`: the device the rewards and the rollout engine are checked for, the reward
    # functions, and the rollout engine's trainer arguments.
    device: str
    rewards: BuiltRewards
    rollout_kwargs: dict[str, Any]

    def prepare_data(self) -> PreparedData:
        from recipeforge.components.rewards import RewardContext, build_rewards
        from recipeforge.components.rollout import rollout_arguments
        from recipeforge.stages.base import StageContext

        data = self.prepare_rows("prompt", max_prompt_length=self.recipe.grpo.max_prompt_length, unit="prompts")
        # Generation appends to the right end of the prompt, so prompts are padded on the left.
        self.tokenizer.padding_side = "left"
        # Rewards and the rollout engine are checked here, before the model loads: recipe mistakes
        # (an unknown reward, a column the data lacks) surface within seconds.
        g = self.recipe.grpo
        # Data prepared alone (`recipeforge preprocess`) has no plan: the checks assume a CPU.
        self.device = device = self.ctx.plan.device if isinstance(self.ctx, StageContext) else "cpu"
        columns = tuple(c for c in data.train.column_names if c != "prompt")
        self.rewards = build_rewards(g.rewards, RewardContext(tokenizer=self.tokenizer, columns=columns,
                                                              device=device, allow_code=self.recipe.allow_code),
                                     locate=self.ctx.locate)
        self.rollout_kwargs = rollout_arguments(g.rollout, device,
                                                location=self.ctx.locate(("grpo", "rollout", "engine")))
        return data

    def needs_base_on_disk(self) -> bool:
        # With a KL term and no adapter, TRL loads the reference model by the policy's name; an
        # engine with its own copy of the policy (vLLM) loads it by path too.
        from recipeforge.components.rollout import rollout_engine

        return self.recipe.grpo.beta > 0 or rollout_engine(self.recipe.grpo.rollout).loads_model_by_path

    def start_rollout_server(self) -> RolloutConfig:
        """Start the generation server when the recipe has the run start it (server mode): on the
        main process, address in ``rollout_server.json``; every rank reads it from there. Returns
        `grpo.rollout` pointing at the server."""
        from recipeforge.components.rollout import rollout_engine, starts_server

        rollout = self.recipe.grpo.rollout
        if not starts_server(rollout):
            return rollout
        ctx = self.context
        run = ctx.run
        if ctx.dist.is_main:
            run.rollout_server.unlink(missing_ok=True)
            model_path = str(self.model.name_or_path)
            ctx.log(f"starting the {rollout.engine} generation server for {model_path}")
            server = rollout_engine(rollout).server
            assert server is not None  # `starts_server` said the engine starts one
            self.server = server.start(rollout, model_path, run.logs / "rollout_server.log")
            # Stopped when training ends (`train`), or at exit when the run fails before that.
            atexit.register(self.stop_rollout_server)
            run.write_rollout_server(self.server.url, engine=rollout.engine, model=model_path,
                                     log=str(run.logs / "rollout_server.log"))
            ctx.log(f"{rollout.engine} generation server at {self.server.url}")
        ctx.barrier()
        url = json.loads(run.rollout_server.read_text())["url"]
        return rollout.model_copy(update={"server_url": url})

    def stop_rollout_server(self) -> None:
        """Stop the generation server this run started, if any (idempotent)."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def train(self) -> dict[str, Any]:
        try:
            return super().train()
        finally:
            self.stop_rollout_server()

    def build_trainer(self) -> Trainer:
        from recipeforge.components.rollout import prepare_rollout_trainer, rollout_arguments, split_trainer_arguments
        from recipeforge.outputs.atomic import crash_safe
        from recipeforge.stages.trl_lengths import length_arguments
        from trl import GRPOConfig, GRPOTrainer

        g, rewards = self.recipe.grpo, self.rewards
        rollout = self.start_rollout_server()
        engine, engine_trainer_args = split_trainer_arguments(
            self.rollout_kwargs if rollout is g.rollout else rollout_arguments(rollout, self.device))
        # Evaluation generates whole groups per batch: round its batch up to a multiple of the group.
        micro = self.context.plan.micro_batch_size
        eval_batch = g.num_generations * -(-micro // g.num_generations)
        # Prompts are cut only by grpo.max_prompt_length (recipeforge cuts them itself, in
        # prepare_data); completions by grpo.max_completion_length. A TRL default never applies.
        lengths = length_arguments(GRPOConfig, max_completion_length=g.max_completion_length,
                                   max_prompt_length=g.max_prompt_length)
        args = self.training_arguments(
            GRPOConfig, num_generations=g.num_generations, **lengths,
            per_device_eval_batch_size=eval_batch,
            temperature=g.temperature, top_p=g.top_p, beta=g.beta, epsilon=g.epsilon, loss_type=g.loss_type,
            scale_rewards=g.scale_rewards, reward_weights=rewards.weights,
            # Extra columns (answers, ...) must survive until the reward functions see them.
            remove_unused_columns=False, log_completions=False, **engine)
        trainer = crash_safe(GRPOTrainer)(model=self.model, reward_funcs=rewards.funcs, args=args, train_dataset=self.train_rows,
                           eval_dataset=self.eval_rows, processing_class=self.tokenizer,
                           reward_processing_classes=rewards.processing_classes, peft_config=self.peft_config(),
                           callbacks=self.callbacks(), **engine_trainer_args)
        prepare_rollout_trainer(rollout, trainer)
        return trainer
