"""recipeforge-liger: Liger kernels as the recipeforge kernel ``liger``.

A recipe enables them with ``kernels: [liger]`` or with options::

    kernels:
      liger: {fused_linear_cross_entropy: true, rope: true}

Liger's Triton kernels replace a model's RMSNorm, RoPE, SwiGLU and cross-entropy (or the fused
linear + cross-entropy that never materializes the logits) with fused GPU kernels. recipeforge turns
the kernel on through transformers' own integration: ``use_liger_kernel=True`` and
``liger_kernel_config`` (keyword arguments of Liger's ``_apply_liger_kernel_to_instance``) in the
trainer arguments. On a CPU run the kernel is skipped with a logged reason; on a GPU without the
liger-kernel package it is an error that says what to install.

This module imports no torch and no liger: recipeforge loads it while validating recipes.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

from pydantic import Field, model_validator

from recipeforge.components.kernels import KernelSpec
from recipeforge.config.schema.base import Section
from recipeforge.errors import RecipeError

__version__ = "0.1.0"

# Options a stage's trainer refuses, as data: option -> {stage: the trainer that raises}. TRL 1.x's
# DPOTrainer and GRPOTrainer patch the model with their own fused LM head and raise a ValueError for
# ``liger_kernel_config={"fused_linear_cross_entropy": True}`` (it would replace that forward).
# pretrain and sft train on transformers' Trainer, which applies it. The plugin's tests ask the
# installed TRL (its trainers, or their source) so this table cannot drift from it.
REFUSED_BY_TRAINER: dict[str, dict[str, str]] = {
    "fused_linear_cross_entropy": {"dpo": "trl.DPOTrainer", "grpo": "trl.GRPOTrainer", "kto": "trl.KTOTrainer",
                                   "rloo": "trl.RLOOTrainer"},
}


class LigerOptions(Section):
    """`kernels.liger`: which of Liger's kernels to apply (unset: Liger's default for the model type)."""

    rope: Optional[bool] = Field(None, description="Fused rotary position embedding.")
    rms_norm: Optional[bool] = Field(None, description="Fused RMSNorm.")
    swiglu: Optional[bool] = Field(None, description="Fused SwiGLU MLP.")
    cross_entropy: Optional[bool] = Field(None, description="Liger cross-entropy on materialized logits.")
    fused_linear_cross_entropy: Optional[bool] = Field(
        None, description="Fuse the LM head with the loss, chunk by chunk: the logits are never materialized.")

    @model_validator(mode="after")
    def _one_loss(self) -> "LigerOptions":
        # Liger refuses both: the fused variant already computes the loss.
        if self.cross_entropy and self.fused_linear_cross_entropy:
            raise ValueError("cross_entropy and fused_linear_cross_entropy cannot both be on; "
                             "fused_linear_cross_entropy includes the loss")
        return self

    def stage_problems(self, stage: str) -> list[tuple[str, str, str]]:
        """(option, message, hint) for each chosen option the trainer of `stage` refuses."""
        out = []
        for option, refusing in REFUSED_BY_TRAINER.items():
            trainer = refusing.get(stage)
            if getattr(self, option) and trainer:
                out.append((option, f"{trainer} ({stage}) refuses Liger's {option}: it patches the model with "
                                    f"its own fused LM head", f"drop kernels.liger.{option} for stage {stage} "
                                    f"(the other Liger kernels still apply)"))
        return out

    def config(self) -> dict:
        """`liger_kernel_config` for the trainer: only the choices the recipe makes."""
        return self.model_dump(exclude_none=True)


def apply_liger(options: LigerOptions, device: str):
    """Trainer arguments that switch Liger on, or why it is skipped on this device."""
    if device != "cuda":
        return {}, "Liger kernels run on GPUs only (Triton)"
    if importlib.util.find_spec("liger_kernel") is None:
        raise RecipeError("kernel liger needs the liger-kernel package, which is not installed",
                          key="kernels.liger",
                          hint="pip install 'recipeforge-liger[kernels]' (or pip install liger-kernel)")
    kwargs: dict = {"use_liger_kernel": True}
    if options.config():
        kwargs["liger_kernel_config"] = options.config()
    return kwargs, None


LIGER = KernelSpec("liger", apply_liger, LigerOptions, gpu_only=True,
                   description="Liger Triton kernels: fused RMSNorm, RoPE, SwiGLU and (fused linear) cross-entropy")
