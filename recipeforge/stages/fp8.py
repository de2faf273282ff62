"""FP8 training in a trainer-based stage (`train.precision: fp8`, `components.fp8`): the checks on
the real device, the conversion of the loaded model before the trainer wraps it (FSDP2, DDP,
torch.compile all come later, in the trainer), the scale refresh FSDP2's float8 all-gather needs
after each optimizer step, and the swap back to plain linear layers before final/ is written."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError
from recipeforge.stages.precision import precision_of

if TYPE_CHECKING:
    import torch
    from transformers import TrainerCallback

    from recipeforge.plan.types import Plan
    from recipeforge.stages.context import StageContext

FP8 = "fp8"


def trains_fp8(plan: Plan) -> bool:
    """Whether the plan trains with float8 matmuls."""
    return precision_of(plan) == FP8


def check(ctx: StageContext) -> None:
    """Refuse fp8 training, before anything loads, without torchao or on a device without float8
    tensor cores (the planner checked the planned GPU; this is the real one)."""
    from recipeforge.components import fp8

    if not trains_fp8(ctx.plan):
        return
    location = ctx.locate(("train", "precision"))
    fp8.check_installed(location=location)
    capability, name = None, None
    if ctx.plan.device == "cuda":
        import torch

        if torch.cuda.is_available():
            capability = torch.cuda.get_device_capability()
            name = torch.cuda.get_device_name()
    fp8.check_device(ctx.plan.device, capability, name, location=location)
    if ctx.plan.tensor_parallel > 1:
        raise RecipeError("train.precision fp8 converts whole linear layers, and this plan splits them with "
                          f"tensor parallelism ({ctx.plan.tensor_parallel}); torchao's float8 tensor-parallel "
                          "styles are not wired here", key="train.precision", location=location,
                          hint="pin distributed.tensor_parallel: 1, or set train.precision: auto")


def convert(ctx: StageContext, model: torch.nn.Module) -> list[str]:
    """Swap the model's eligible linear layers for torchao's `Float8Linear`, with the filter the plan
    reports (`plan.fp8`); the float8 all-gather is asked for on a model loaded whole only (one loaded
    shard by shard gets its weights after FSDP2 sharded placeholders)."""
    from recipeforge.components import fp8

    settings = ctx.recipe.train.fp8_settings()
    # a plan that shards the weights with fp8 is FSDP2's (DeepSpeed and Megatron refuse fp8)
    gather = settings.all_gather and ctx.plan.traits.shards_weights and ctx.load_sharded is None
    names = fp8.convert(model, settings.scaling, gather)
    ctx.log(f"fp8: {len(names)} linear layers compute in float8 ({settings.scaling} scaling; torchao); the "
            f"output head and layers with dims not multiples of 16 stay bf16"
            + ("; FSDP2 all-gathers them in float8" if gather else ""))
    return names


def gathers_fp8(model: torch.nn.Module) -> bool:
    """Whether `model` holds weights wrapped for FSDP2's float8 all-gather (their scales must be
    refreshed after each optimizer step)."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    return any(isinstance(p, WeightWithDynamicFloat8CastTensor)
               or isinstance(getattr(p, "_local_tensor", None), WeightWithDynamicFloat8CastTensor)
               for p in model.parameters())


def callbacks(ctx: StageContext, model: torch.nn.Module | None) -> list[TrainerCallback]:
    """The float8 scale refresh after each optimizer step, where FSDP2 gathers in float8."""
    from recipeforge.components import fp8

    if not trains_fp8(ctx.plan) or model is None or not gathers_fp8(model):
        return []
    return [fp8.precompute_callback()]


def strip(model: torch.nn.Module) -> None:
    """Plain `nn.Linear` layers again before final/ is written (same weights, transformers' names)."""
    from recipeforge.components import fp8

    fp8.strip(model)
