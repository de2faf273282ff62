"""The whole recipe: common sections, one class per stage, discriminated on `stage`.

A stage from a plugin gets its class made from its spec (`schema.plugin_stages.recipe_class`). The
union and the JSON schema (`recipe_adapter`, what the docs show) hold the built-in stages only.

Building a `Recipe` validates each section on its own. The cross-field rules (`rules.py`) take the
built recipe as data; `config.validate` runs them and reports all violations together, each at the
key the user has to change.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from recipeforge.stage_specs import STAGES, known_stage_spec
from recipeforge.config.schema.adapter import AdapterConfig
from recipeforge.config.schema.base import Section
from recipeforge.config.schema.data import DataConfig
from recipeforge.config.schema.distributed import DistributedConfig, HardwareConfig
from recipeforge.config.schema.evaluation import EvalConfig
from recipeforge.config.schema.lock import LockConfig
from recipeforge.config.schema.logging import LoggingConfig
from recipeforge.config.schema.model import ModelConfig
from recipeforge.config.schema.moe import MoEConfig
from recipeforge.config.schema.output import OutputConfig
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
            spec = known_stage_spec(value.get("stage"))  # an unknown stage is refused by the stage check
            value = {**value, "data": {**value["data"], "packing": spec is not None and spec.packs_by_default}}
        return value
