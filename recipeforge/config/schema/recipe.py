"""The whole recipe: common sections, one class per stage, discriminated on `stage`.

Building a `Recipe` validates each section on its own. The cross-field rules (`rules.py`) take the
built recipe as data; `config.validate` runs them and reports all violations together, each at the
key the user has to change.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, TypeAdapter, field_validator, model_validator

from recipeforge.stage_specs import STAGE_SPECS, STAGES
from recipeforge.config.schema.adapter import AdapterConfig
from recipeforge.config.schema.base import Section
from recipeforge.config.schema.data import DataConfig
from recipeforge.config.schema.distill import DistillConfig
from recipeforge.config.schema.distributed import DistributedConfig, HardwareConfig
from recipeforge.config.schema.evaluation import EvalConfig
from recipeforge.config.schema.lock import LockConfig
from recipeforge.config.schema.logging import LoggingConfig
from recipeforge.config.schema.model import ModelConfig
from recipeforge.config.schema.moe import MoEConfig
from recipeforge.config.schema.output import OutputConfig
from recipeforge.config.schema.preference import CPOConfig, KTOConfig, ORPOConfig
from recipeforge.config.schema.reward_stage import RewardModelConfig
from recipeforge.config.schema.stages import DPOConfig, GRPOConfig, RLOOConfig
from recipeforge.config.schema.train import TrainConfig

STAGE_CHOICES = " | ".join(STAGES)


class Recipe(Section):
    """A complete, validated training recipe (immutable). Subclassed once per stage."""

    stage: str = Field(description=f"Training stage: {STAGE_CHOICES}.")
    name: Optional[str] = Field(None, description="Run name (default: the recipe file name).")
    description: Optional[str] = Field(None, description="Free text, copied into the model card.")
    model: ModelConfig = Field(description="The base model.")
    adapter: AdapterConfig = Field(default_factory=AdapterConfig, description="Full fine-tune, LoRA or QLoRA.")
    data: DataConfig = Field(description="Datasets and tokenization.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimization.")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="Distributed backend.")
    moe: MoEConfig = Field(default_factory=MoEConfig,
                           description="Mixture-of-experts models: routers, load-balancing loss, expert LoRA.")
    hardware: Optional[HardwareConfig] = Field(None, description="Target machine for planning (default: this one).")
    kernels: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Kernels to enable from the kernels registry, by name with options: {flash_attn: {}, "
                    "torch_compile: {mode: default}, liger: {fused_linear_cross_entropy: true}}; each kernel checks "
                    "its own options. A plain list of names also works.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Experiment trackers.")
    output: OutputConfig = Field(default_factory=OutputConfig, description="Run directory and checkpoints.")
    eval: EvalConfig = Field(default_factory=EvalConfig,
                             description="Benchmarks of the finished model (lm-evaluation-harness).")
    allow_code: bool = Field(
        False, description="Allow the recipe to run Python code it names: a reward by dotted path (e.g. "
                           "`my_pkg.rewards:f`), `model.trust_remote_code`, lm-eval task files in `eval.tasks`; "
                           "--trust-code (RECIPEFORGE_TRUST_CODE=1) does the same for one run. Reported in the plan.")
    lock: Optional[LockConfig] = Field(
        None, description="Written by `recipeforge resolve --lock`: versions, revisions and fingerprints the recipe "
                          "was resolved against; `train` warns when they differ (`--strict`: refuses).")

    @field_validator("kernels", mode="before")
    @classmethod
    def _kernel_list(cls, value: object) -> object:
        # `kernels: [liger, flash_attn]` is shorthand for a mapping with default options.
        if isinstance(value, (list, tuple)):
            if not all(isinstance(name, str) for name in value):
                raise ValueError("a list of kernels holds names only, e.g. [liger, flash_attn]")
            return {name: {} for name in value}
        return value

    @model_validator(mode="before")
    @classmethod
    def _stage_defaults(cls, value: object) -> object:
        # Packing defaults on for pretraining (documents are short relative to sequence_len), off elsewhere.
        if isinstance(value, dict) and isinstance(value.get("data"), dict) and value["data"].get("packing") is None:
            value = {**value, "data": {**value["data"], "packing": value.get("stage") == "pretrain"}}
        return value


class PretrainRecipe(Recipe):
    """The recipe of stage `pretrain` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["pretrain"] = Field(description=f"Training stage: {STAGE_CHOICES}.")


class SFTRecipe(Recipe):
    """The recipe of stage `sft` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["sft"] = Field(description=f"Training stage: {STAGE_CHOICES}.")


class DPORecipe(Recipe):
    """The recipe of stage `dpo` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["dpo"] = Field(description=f"Training stage: {STAGE_CHOICES}.")
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="DPO settings.")


class GRPORecipe(Recipe):
    """The recipe of stage `grpo` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["grpo"] = Field(description=f"Training stage: {STAGE_CHOICES}.")
    grpo: GRPOConfig = Field(description="GRPO settings (rewards are required).")


class ORPORecipe(Recipe):
    """The recipe of stage `orpo` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["orpo"] = Field(description=f"Training stage: {STAGE_CHOICES}.")
    orpo: ORPOConfig = Field(default_factory=ORPOConfig, description="ORPO settings.")


class KTORecipe(Recipe):
    """The recipe of stage `kto` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["kto"] = Field(description=f"Training stage: {STAGE_CHOICES}.")
    kto: KTOConfig = Field(default_factory=KTOConfig, description="KTO settings.")


class CPORecipe(Recipe):
    """The recipe of stage `cpo` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["cpo"] = Field(description=f"Training stage: {STAGE_CHOICES}.")
    cpo: CPOConfig = Field(default_factory=CPOConfig, description="CPO / SimPO settings.")


class RewardRecipe(Recipe):
    """The recipe of stage `reward` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["reward"] = Field(description=f"Training stage: {STAGE_CHOICES}.")
    reward: RewardModelConfig = Field(default_factory=RewardModelConfig, description="Reward-model settings.")


class DistillRecipe(Recipe):
    """The recipe of stage `distill` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["distill"] = Field(description=f"Training stage: {STAGE_CHOICES}.")
    distill: DistillConfig = Field(description="The teacher and the distillation loss.")


class RLOORecipe(Recipe):
    """The recipe of stage `rloo` (its description: `stage_specs.STAGE_SPECS`)."""

    stage: Literal["rloo"] = Field(description=f"Training stage: {STAGE_CHOICES}.")
    rloo: RLOOConfig = Field(description="RLOO settings (rewards are required).")


AnyRecipe = Annotated[Union[PretrainRecipe, SFTRecipe, DPORecipe, GRPORecipe, ORPORecipe, KTORecipe, CPORecipe,
                            RewardRecipe, DistillRecipe, RLOORecipe],
                      Field(discriminator="stage")]
STAGE_CLASSES: dict[str, type[Recipe]] = {
    "pretrain": PretrainRecipe, "sft": SFTRecipe, "dpo": DPORecipe, "grpo": GRPORecipe,
    "orpo": ORPORecipe, "kto": KTORecipe, "cpo": CPORecipe, "reward": RewardRecipe, "distill": DistillRecipe,
    "rloo": RLOORecipe}
# Sections that exist only for one stage, for "this section belongs to stage X" hints.
STAGE_ONLY_SECTIONS = {spec.section: name.value for name, spec in STAGE_SPECS.items() if spec.section}
for _stage, _cls in STAGE_CLASSES.items():  # each stage's summary, as the schema and docs show it
    _cls.__doc__ = STAGE_SPECS[_stage].summary

_ADAPTER: TypeAdapter | None = None


def recipe_adapter() -> TypeAdapter:
    """The (cached) pydantic TypeAdapter for the discriminated recipe union."""
    global _ADAPTER
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(AnyRecipe)
    return _ADAPTER
