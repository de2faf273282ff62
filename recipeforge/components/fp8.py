"""FP8 training (`train.precision: fp8`): torchao's float8 linear layers, as torchtitan uses them.

`convert` swaps the eligible `nn.Linear` layers of a model for torchao's `Float8Linear`
(`convert_to_float8_training`): their matmuls run in float8 (e4m3 inputs and weights, e5m2
gradients for tensorwise scaling, e4m3 throughout for rowwise) with scales computed from each
tensor (or row) on the fly; the weights themselves stay as loaded (fp32 masters under autocast on
one GPU or DDP, FSDP2's sharded fp32 weights), so the optimizer and the checkpoint see ordinary
weights. The filter is the one the planner reports (`eligible`): the output head stays in bf16
(its accuracy matters most, torchtitan skips it), as do layers whose in or out features are not a
multiple of 16 (float8 tensor cores need it). Embeddings and norms are not linear layers.

`strip` swaps them back to plain `nn.Linear` (the same parameters) before final/ is written, so the
saved safetensors have transformers' names and dtypes. torch and torchao are imported inside the
functions; `recipeforge validate` and `plan` never import them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from recipeforge.errors import Location, RecipeError
from recipeforge.stage_specs import Names

INSTALL = "pip install 'recipeforge[torchao]'"
FP8_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.0) and newer
DIVISOR = 16             # torch._scaled_mm needs both dims of each operand divisible by 16


class FP8Scaling(Names):
    """How `train.fp8.scaling` scales the float8 casts (torchao's recipe names)."""

    TENSORWISE = "tensorwise"  # one scale per tensor; float8 all-gather with FSDP2
    ROWWISE = "rowwise"        # one scale per row (power-of-2 scales); needs torch.compile to be fast


FP8_SCALINGS = tuple(s.value for s in FP8Scaling)

if TYPE_CHECKING:
    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments


def eligible(in_features: int, out_features: int, *, is_head: bool = False) -> bool:
    """Whether a linear layer of these dims converts to float8 (the planner's and the runtime's rule)."""
    return not is_head and in_features % DIVISOR == 0 and out_features % DIVISOR == 0


def module_filter(model: torch.nn.Module) -> Callable[[torch.nn.Module, str], bool]:
    """torchao's `module_filter_fn` for `model`: True for an `nn.Linear` that is not the output head
    and whose dims are multiples of 16."""
    import torch

    # a transformers model names its output head; a bare module has none
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None

    def keep(module: torch.nn.Module, _fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear)
                and eligible(module.in_features, module.out_features, is_head=module is head))

    return keep


def converted_names(model: torch.nn.Module) -> list[str]:
    """Names of the linear layers `convert` swaps in `model` (before conversion)."""
    keep = module_filter(model)
    return [name for name, module in model.named_modules() if keep(module, name)]


def float8_config(scaling: str, all_gather: bool) -> Any:
    """torchao's `Float8LinearConfig` for `train.fp8`: the named recipe, with FSDP2's float8
    all-gather where asked and supported (tensorwise only, torchao's own restriction)."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(FP8Scaling(scaling).value)
    if all_gather and FP8Scaling(scaling) == FP8Scaling.TENSORWISE:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    return config


def convert(model: torch.nn.Module, scaling: str, all_gather: bool) -> list[str]:
    """Swap `model`'s eligible linear layers for torchao's `Float8Linear` in place (before FSDP2
    wraps the model and before torch.compile); returns their names."""
    from torchao.float8 import convert_to_float8_training

    names = converted_names(model)
    convert_to_float8_training(model, config=float8_config(scaling, all_gather), module_filter_fn=module_filter(model))
    return names


def is_converted(model: torch.nn.Module) -> bool:
    """Whether `model` holds torchao float8 linear layers."""
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(m, Float8Linear) for m in model.modules())


def plain_tensor(value: torch.Tensor) -> torch.Tensor:
    """`value` without torchao's float8 all-gather wrapper (`WeightWithDynamicFloat8CastTensor`
    holds the high-precision weight in `_tensor`; an FSDP2 DTensor holds it as its local shard);
    other tensors as they are."""
    from torch.distributed.tensor import DTensor
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    if isinstance(value, DTensor) and isinstance(value._local_tensor, WeightWithDynamicFloat8CastTensor):
        # an FSDP2 shard: the same sharding around the unwrapped local tensor
        return DTensor.from_local(value._local_tensor._tensor, value.device_mesh, value.placements,
                                  run_check=False, shape=value.shape, stride=value.stride())
    return value._tensor if isinstance(value, WeightWithDynamicFloat8CastTensor) else value


def plain_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """A gathered state dict with every float8 all-gather weight unwrapped (the names do not change:
    `Float8Linear` keeps `weight` and `bias`)."""
    return {name: plain_tensor(value) for name, value in state.items()}


def strip(model: torch.nn.Module) -> int:
    """Swap every `Float8Linear` back to a plain `nn.Linear` holding the same weight and bias (unwrapped
    from the all-gather tensor subclass); returns how many were swapped."""
    import torch
    from torchao.float8.float8_linear import Float8Linear

    swapped = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, Float8Linear):
                continue
            plain = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                    device="meta")
            weight = plain_tensor(child.weight.data)
            plain.weight = torch.nn.Parameter(weight, requires_grad=child.weight.requires_grad)
            if child.bias is not None:
                plain.bias = child.bias
            setattr(module, child_name, plain)
            swapped += 1
    return swapped


def check_installed(location: Location | None = None) -> None:
    """Refuse fp8 training before anything loads when torchao is not installed."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        raise RecipeError("train.precision fp8 trains with torchao's float8 linear layers, and torchao is not "
                          "installed", key="train.precision", location=location,
                          hint=f"{INSTALL}, or set train.precision: auto")


def check_device(device: str, capability: tuple[int, int] | None, gpu_name: str | None,
                 location: Location | None = None) -> None:
    """Refuse fp8 training on the real device when it has no float8 tensor cores (compute capability
    below 8.9, or no CUDA GPU at all)."""
    if device == "cuda" and capability is not None and tuple(capability) >= FP8_CAPABILITY:
        return
    where = (f"this GPU ({gpu_name or 'unknown'}) has compute capability {'.'.join(map(str, capability))}"
             if device == "cuda" and capability is not None else "this run has no CUDA GPU")
    raise RecipeError(f"train.precision fp8 needs float8 tensor cores (compute capability 8.9 or newer: "
                      f"L4, L40S, RTX 4090, H100, H200, B200), and {where}", key="train.precision",
                      location=location, hint="set train.precision: auto (bf16 mixed precision)")


def precompute_callback() -> Any:
    """A trainer callback that computes the float8 scales of every FSDP2-sharded weight with one
    all-reduce after each optimizer step (`precompute_float8_dynamic_scale_for_fsdp`), as torchao
    requires with the float8 all-gather."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
    from transformers import TrainerCallback

    class Float8Scales(TrainerCallback):  # type: ignore[misc]
        """Float8 scales of the sharded weights, refreshed after each optimizer step."""

        def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                             model: torch.nn.Module | None = None, **kwargs: Any) -> None:
            if model is not None:
                precompute_float8_dynamic_scale_for_fsdp(model)

    return Float8Scales()
