"""What the on-policy RL stages (GRPO, RLOO) share: prompt rows, reward functions and the rollout engine.

A stage whose `StageSpec.rollout` is set has an `OnPolicyConfig` section (`grpo:`, `rloo:`): its
prompts are cut to `max_prompt_length` and padded on the left, its rewards come from the rewards
registry (the dataset's extra columns reach them as keyword arguments; the trainer logs each
reward function's mean as ``rewards/<name>/mean``), and its completions come from the rollout
engine the section names (`hf`: the policy's own `generate`), whose generation server the run may
start itself. A subclass says which TRL trainer runs and adds its own loss settings.
"""

from __future__ import annotations

import atexit
import json
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.components.prepared import PreparedData
from recipeforge.stages.base import TrainerStage

if TYPE_CHECKING:
    from recipeforge.components.rewards import BuiltRewards
    from recipeforge.components.rollout import RunningServer
    from recipeforge.config.schema.stages import OnPolicyConfig, RolloutConfig


class OnPolicyStage(TrainerStage):
    """An on-policy RL stage on prompt rows with weighted reward functions (`section` names its settings)."""

    section: str  # the recipe section of the stage's `OnPolicyConfig` (the stage's name)
    server: RunningServer | None = None  # the generation server this run started (server mode with launch: true)
    # Set by `prepare_data`: the device the rewards and the rollout engine are checked for, the reward
    # functions, and the rollout engine's trainer arguments.
    device: str
    rewards: BuiltRewards
    rollout_kwargs: dict[str, Any]
    environment: Callable[[], Any] | None = None  # grpo.environment's factory (TRL's environment_factory)

    @property
    def settings(self) -> OnPolicyConfig:
        """The recipe's on-policy section (`grpo:` or `rloo:`)."""
        settings: OnPolicyConfig = getattr(self.recipe, self.section)
        return settings

    @property
    def max_staleness(self) -> int:
        """Steps the generating policy may lag the trained one (`grpo.max_staleness`; 0: on-policy)."""
        return int(getattr(self.settings, "max_staleness", 0))

    def prepare_data(self) -> PreparedData:
        from recipeforge.components.rewards import RewardContext, build_rewards
        from recipeforge.components.rollout import rollout_arguments
        from recipeforge.stages.base import StageContext

        g = self.settings
        data = self.prepare_rows("prompt", max_prompt_length=g.max_prompt_length, unit="prompts")
        # Generation appends to the right end of the prompt, so prompts are padded on the left.
        self.tokenizer.padding_side = "left"
        # Rewards and the rollout engine are checked here, before the model loads: recipe mistakes
        # (an unknown reward, a column the data lacks) surface within seconds.
        # Data prepared alone (`recipeforge preprocess`) has no plan: the checks assume a CPU.
        self.device = device = self.ctx.plan.device if isinstance(self.ctx, StageContext) else "cpu"
        columns = tuple(c for c in data.train.column_names if c != "prompt")
        self.rewards = build_rewards(g.rewards, RewardContext(tokenizer=self.tokenizer, columns=columns,
                                                              device=device, allow_code=self.recipe.allow_code),
                                     locate=self.ctx.locate, section=self.section)
        self.rollout_kwargs = rollout_arguments(g.rollout, device, section=self.section,
                                                location=self.ctx.locate((self.section, "rollout", "engine")),
                                                max_staleness=self.max_staleness)
        env = getattr(g, "environment", None)
        if env is not None:
            from recipeforge.components.environments import environment_factory
            from recipeforge.stages.tool_episodes import check_conversational, response_format

            check_conversational(data.train, location=self.ctx.locate((self.section, "environment")))
            self.environment = environment_factory(env, allow_code=self.recipe.allow_code, locate=self.ctx.locate,
                                                   section=self.section)
            response_format(self.tokenizer, location=self.ctx.locate(("data", "chat_template")))
        return data

    def needs_base_on_disk(self) -> bool:
        # With a KL term and no adapter, TRL loads the reference model by the policy's name; an
        # engine with its own copy of the policy (vLLM) loads it by path too.
        from recipeforge.components.rollout import rollout_engine

        return self.settings.beta > 0 or rollout_engine(self.settings.rollout).loads_model_by_path

    def start_rollout_server(self) -> RolloutConfig:
        """Start the generation server when the recipe has the run start it (server mode): on the
        main process, address in ``rollout_server.json``; every rank reads it from there. Returns
        the section's `rollout` pointing at the server."""
        from recipeforge.components.rollout import rollout_engine, starts_server

        rollout = self.settings.rollout
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

    def rollout_setup(self) -> tuple[RolloutConfig, dict[str, Any], dict[str, Any]]:
        """(rollout, config arguments, trainer arguments) of the rollout engine: the server this run
        started, when it starts one, else the engine's arguments checked in `prepare_data`."""
        from recipeforge.components.rollout import rollout_arguments, split_trainer_arguments

        rollout = self.start_rollout_server()
        kwargs = (self.rollout_kwargs if rollout is self.settings.rollout
                  else rollout_arguments(rollout, self.device, section=self.section,
                                         max_staleness=self.max_staleness))
        engine, trainer_args = split_trainer_arguments(kwargs)
        return rollout, engine, trainer_args

    def on_policy_arguments(self, config_cls: type) -> dict[str, Any]:
        """The `config_cls` (TRL's GRPOConfig, RLOOConfig) arguments every on-policy stage sets from
        its section: group size, lengths, sampling, KL, clipping and reward weights."""
        from recipeforge.stages.trl_lengths import length_arguments

        g = self.settings
        # Evaluation generates whole groups per batch: round its batch up to a multiple of the group.
        micro = self.context.plan.micro_batch_size
        eval_batch = g.num_generations * -(-micro // g.num_generations)
        # Prompts are cut only by max_prompt_length (recipeforge cuts them itself, in prepare_data);
        # completions by max_completion_length. A TRL default never applies.
        lengths = length_arguments(config_cls, max_completion_length=g.max_completion_length,
                                   max_prompt_length=g.max_prompt_length)
        return dict(num_generations=g.num_generations, **lengths, per_device_eval_batch_size=eval_batch,
                    temperature=g.temperature, top_p=g.top_p, beta=g.beta, epsilon=g.epsilon,
                    reward_weights=self.rewards.weights or None,
                    # Extra columns (answers, ...) must survive until the reward functions see them.
                    remove_unused_columns=False, log_completions=False)

    def trainer_inputs(self) -> dict[str, Any]:
        """The keyword arguments every TRL on-policy trainer takes from the run."""
        return dict(model=self.model, reward_funcs=self.rewards.funcs, train_dataset=self.train_rows,
                    eval_dataset=self.eval_rows, processing_class=self.tokenizer,
                    reward_processing_classes=self.rewards.processing_classes, peft_config=self.peft_config(),
                    callbacks=self.callbacks())
