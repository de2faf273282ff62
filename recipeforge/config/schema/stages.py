"""Stage-specific sections: `dpo:`, and the on-policy RL sections `grpo:` and `rloo:` (one shared base)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field

from recipeforge.config.schema.base import Section


class DPOConfig(Section):
    """Direct Preference Optimization (TRL DPOTrainer)."""

    beta: float = Field(0.1, gt=0, description="Strength of the KL penalty towards the reference model.")
    loss_type: Literal["sigmoid", "hinge", "ipo", "robust", "bco_pair", "sppo_hard", "nca_pair", "apo_zero", "apo_down"] = Field(
        "sigmoid", description="Preference loss (sigmoid is the DPO paper's).")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="Conservative DPO / robust label smoothing.")
    reference: str = Field(
        "auto", min_length=1,
        description="Reference model: `auto` (the base model; with an adapter, the base with adapters disabled) "
                    "or a path/hub id.")
    max_prompt_length: Optional[int] = Field(None, gt=0, description="Truncate prompts to this many tokens.")
    rpo_alpha: Optional[float] = Field(None, ge=0, description="Weight of the NLL term on chosen responses (RPO).")


class RewardSpec(Section):
    """One reward function from the rewards registry, with its weight and arguments."""

    name: str = Field(
        min_length=1,
        description="A registered reward (accuracy, exact_match, length, regex, reward_model, or a plugin's), or "
                    "`module:function` Python code, which needs the opt-in (`allow_code: true` or --trust-code).")
    weight: float = Field(1.0, description="Weight in the summed reward.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments for the reward; checked against the reward's own schema when it declares one.")


class RolloutConfig(Section):
    """How an on-policy RL stage (GRPO, RLOO) generates completions."""

    engine: str = Field(
        "hf", min_length=1,
        description="Rollout engine from the registry: `hf` (generate) or a plugin's (`vllm` from recipeforge-vllm).")
    mode: Literal["colocate", "server"] = Field(
        "colocate", description="Share the training GPUs (`colocate`) or generate on a separate server (`server`); "
                                "each engine lists the modes it supports.")
    gpu_memory_utilization: float = Field(
        0.3, gt=0, lt=1, description="Colocated engines that hold their own memory (vllm): share of each GPU for "
                                     "their weights and KV cache; the planner reserves it.")
    server_url: Optional[str] = Field(None, description="Server mode: base URL of the generation server.")
    timeout_s: float = Field(
        1800.0, gt=0,
        description="Server mode: seconds one generation request (a step's completions) may take. A server that "
                    "does not answer in time, or refuses connections, stops the run with exit 2 naming its URL; "
                    "checkpoints already written are kept and `train` resumes from the last one.")
    sync_timeout_s: float = Field(
        600.0, gt=0,
        description="Server mode: seconds a weight sync into the server (the trained weights pushed after an "
                    "optimizer step) may take before the run stops the same way.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine-specific options, checked against the engine's own schema "
                    "(e.g. vllm: {tensor_parallel_size: 2, enable_sleep_mode: true}).")


class EnvironmentSpec(Section):
    """A multi-turn tool environment: the model calls its tools during generation (TRL's environment_factory)."""

    name: str = Field(
        min_length=1,
        description="A registered environment (`calculator`, or a plugin's) or `module:Class` Python code, which "
                    "needs the opt-in (`allow_code: true` or --trust-code).")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment class.")
    max_turns: int = Field(4, ge=1, description="Tool-calling turns per episode at most (then the episode ends).")


class OnPolicyConfig(Section):
    """What every on-policy RL stage (GRPO, RLOO) shares: sampling, KL, clipping, rewards and rollout.

    Completions are sampled per prompt by a rollout engine and scored by weighted reward functions;
    this is the section of a stage whose `StageSpec.rollout` is set."""

    num_generations: int = Field(8, ge=2, description="Completions sampled per prompt (the group).")
    max_completion_length: int = Field(256, gt=0, description="Tokens generated per completion.")
    max_prompt_length: Optional[int] = Field(None, gt=0, description="Truncate prompts to this many tokens.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    beta: float = Field(0.0, ge=0, description="KL penalty to the reference model (0: no reference model).")
    epsilon: float = Field(0.2, gt=0, description="PPO-style clipping range.")
    rewards: tuple[RewardSpec, ...] = Field(
        (), description="Reward functions (at least one, unless `grpo.environment` scores its episodes itself).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Completion generation.")


class GRPOConfig(OnPolicyConfig):
    """Group Relative Policy Optimization (TRL GRPOTrainer)."""

    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = Field("dapo", description="Loss normalization variant.")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="Advantage normalization.")
    environment: Optional[EnvironmentSpec] = Field(
        None, description="Multi-turn episodes with tools: the model calls the environment's tools while it "
                          "generates; tool results are not trained. Prompts must be conversations (messages).")
    max_staleness: int = Field(
        0, ge=0,
        description="Asynchronous GRPO: how many optimizer steps the policy that generated a step's completions may "
                    "lag the policy being trained. 0: on-policy (generate, then train). N > 0: the rollout engine "
                    "generates the next N steps' completions while the trainer trains, and the loss corrects for "
                    "the difference with truncated importance sampling. Needs an engine mode that generates "
                    "concurrently (vllm in server mode).")


class RLOOConfig(OnPolicyConfig):
    """REINFORCE Leave-One-Out (TRL RLOOTrainer); defaults as TRL's RLOOConfig sets them.

    Each completion's baseline is the mean reward of the other completions of its prompt."""

    num_generations: int = Field(2, ge=2, description="Completions sampled per prompt (the leave-one-out group).")
    max_completion_length: int = Field(512, gt=0, description="Tokens generated per completion.")
    beta: float = Field(0.05, ge=0, description="KL coefficient towards the reference model (0: no reference "
                                                "model is loaded).")
    normalize_advantages: bool = Field(False, description="Normalize the advantages of each generation batch to "
                                                          "mean 0 and standard deviation 1.")
    mask_truncated_completions: bool = Field(False, description="Leave completions cut at max_completion_length "
                                                                "out of the loss.")
