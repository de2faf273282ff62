"""The recipe schema: one pydantic model per section, one recipe class per stage."""

from recipeforge.config.schema.adapter import AdapterConfig, QuantConfig
from recipeforge.config.schema.data import DataConfig, DatasetSpec
from recipeforge.config.schema.distributed import DistributedConfig, HardwareConfig
from recipeforge.config.schema.evaluation import EvalConfig
from recipeforge.config.schema.logging import LoggingConfig
from recipeforge.config.schema.model import ModelConfig
from recipeforge.config.schema.output import OutputConfig
from recipeforge.config.schema.recipe import STAGES, Recipe
from recipeforge.config.schema.stage_recipes import (STAGE_CLASSES, AnyRecipe, DPORecipe, GRPORecipe, PretrainRecipe,
                                                     RLOORecipe, SFTRecipe, recipe_adapter)
from recipeforge.config.schema.stages import (DPOConfig, GRPOConfig, OnPolicyConfig, RewardSpec, RLOOConfig,
                                              RolloutConfig)
from recipeforge.config.schema.train import TrainConfig

__all__ = [
    "AdapterConfig", "AnyRecipe", "DPOConfig", "DPORecipe", "DataConfig", "DatasetSpec", "DistributedConfig",
    "EvalConfig", "GRPOConfig", "GRPORecipe", "HardwareConfig", "LoggingConfig", "ModelConfig", "OnPolicyConfig",
    "OutputConfig", "PretrainRecipe", "RLOOConfig", "RLOORecipe", "QuantConfig", "Recipe", "RewardSpec", "RolloutConfig", "SFTRecipe", "STAGES",
    "STAGE_CLASSES", "TrainConfig", "recipe_adapter",
]
