"""One recipe class per built-in stage, with the section only that stage has, and their union discriminated
on `stage`. The union and the JSON schema (`recipe_adapter`, what the docs show) hold the built-in stages
only; a plugin stage's class is made from its spec (`schema.plugin_stages`)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, TypeAdapter

from recipeforge.config.schema.distill import DistillConfig
from recipeforge.config.schema.preference import CPOConfig, KTOConfig, ORPOConfig
from recipeforge.config.schema.recipe import STAGE_CHOICES, Recipe
from recipeforge.config.schema.reward_stage import RewardModelConfig
from recipeforge.config.schema.stages import DPOConfig, GRPOConfig, RLOOConfig
from recipeforge.stage_specs import STAGE_SPECS


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
STAGE_ONLY_SECTIONS = {spec.section: name for name, spec in STAGE_SPECS.items() if spec.section}
for _stage, _cls in STAGE_CLASSES.items():  # each stage's summary, as the schema and docs show it
    _cls.__doc__ = STAGE_SPECS[_stage].summary

_ADAPTER: TypeAdapter | None = None


def recipe_adapter() -> TypeAdapter:
    """The (cached) pydantic TypeAdapter for the discriminated recipe union."""
    global _ADAPTER
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(AnyRecipe)
    return _ADAPTER
