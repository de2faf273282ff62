"""Precision settings of a training process: the plan's `train.precision` decision, TF32, and the
optimizer of pure bf16 with stochastic rounding. Pure functions of the recipe, the plan and the
GPU's compute capability, so each decision is testable without a GPU."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, Literal

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    import torch

    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.config.schema.train import TrainConfig
    from recipeforge.plan.types import Plan


def precision_of(plan: Plan) -> str | None:
    """The plan's `train.precision` decision (fp32 | mixed | pure_bf16 | pure_bf16_sr | fp8), or None for a
    plan that does not record one."""
    choice = plan.reasons.get("precision")
    value: str | None = choice.value if choice is not None else None
    return value


def loads_fp32_masters(plan: Plan, adapter_type: str, compute_dtype: str) -> bool:
    """Whether the trained weights load in fp32 and compute under 16-bit autocast: full fine-tuning in
    fp16 (always), or in bf16 on one GPU or DDP when the plan chose mixed precision or fp8 (mixed
    precision with float8 matmuls; other backends keep their own fp32 masters)."""
    if adapter_type != "none" or plan.device != "cuda":
        return False
    if compute_dtype == "torch.float16":
        return True  # fp16 weights cannot be trained with fp16 mixed precision, on any backend
    return compute_dtype == "torch.bfloat16" and plan.traits.trainer_holds_weights \
        and precision_of(plan) in ("mixed", "fp8")


def final_weights_dtype(recipe: Recipe, plan: Plan) -> torch.dtype | None:
    """The torch dtype final/'s full weights are written in: the run's 16-bit compute dtype
    (`model.dtype` on the plan's device), so a model trained on fp32 master weights (mixed precision,
    FSDP2's fp32 sharded parameters) is written as the model it computes with, at half the size.
    None when the run computes in fp32 (written as trained)."""
    import torch

    from recipeforge.components.models import resolve_dtype

    dtype = resolve_dtype(recipe.model.dtype, plan.device)
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def final_shard_bytes(recipe: Recipe) -> int:
    """The largest safetensors file of final/'s full weights, in bytes (`output.max_shard_size`)."""
    from recipeforge.config.schema.output import size_bytes

    return size_bytes(recipe.output.max_shard_size)


def tf32_argument(setting: bool | Literal["auto"], device: str, capability: tuple[int, int] | None) -> bool | None:
    """`TrainingArguments.tf32` for `train.tf32`: None (leave torch's default) off CUDA; `auto` turns
    TF32 on for compute capability 8.0 (Ampere) or newer; `true` on an older GPU is refused, since
    it has no TF32 tensor cores."""
    if device != "cuda":
        return None  # a CUDA matmul setting: nothing to switch on the CPU
    ampere = capability is not None and tuple(capability) >= (8, 0)
    if setting is True and not ampere:
        raise RecipeError(f"train.tf32 needs a GPU of compute capability 8.0 (Ampere) or newer; this one is "
                          f"{'.'.join(map(str, capability)) if capability else 'unknown'}", key="train.tf32",
                          hint="set train.tf32: auto")
    if setting is False:
        return False
    return True if ampere else None


def cuda_capability() -> tuple[int, int] | None:
    """This process's GPU's compute capability, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major, minor


def check_sr_optimizer(plan: Plan) -> None:
    """Refuse pure bf16 with stochastic rounding when torchao is missing, before anything loads."""
    if precision_of(plan) == "pure_bf16_sr" and importlib.util.find_spec("torchao") is None:
        raise RecipeError("train.precision pure_bf16_sr needs the torchao package, which is not installed",
                          key="train.precision", hint="pip install torchao, or set train.precision: pure_bf16")


def sr_optimizer(plan: Plan, train: TrainConfig) -> tuple[type, dict[str, Any]] | None:
    """(optimizer class, keyword arguments) for the Trainer's `optimizer_cls_and_kwargs` when the plan
    trains pure bf16 with stochastic rounding: torchao's AdamW computes each update in fp32 and
    rounds it to bf16 stochastically. None otherwise. Weight decay comes with the Trainer's parameter
    groups."""
    if precision_of(plan) != "pure_bf16_sr":
        return None
    check_sr_optimizer(plan)
    optim = importlib.import_module("torchao.optim")
    # torchao names its full-precision-state AdamW `_AdamW` (older releases: prototype.low_bit_optim).
    cls = getattr(optim, "AdamW", None) or getattr(optim, "_AdamW", None)
    if cls is None:
        cls = getattr(importlib.import_module("torchao.prototype.low_bit_optim"), "_AdamW")
    return cls, {"lr": train.learning_rate, "betas": (train.adam_beta1, train.adam_beta2),
                 "bf16_stochastic_round": True}
