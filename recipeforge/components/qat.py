"""Quantization-aware training (`train.qat`): torchao's fake quantization on the linear layers that
`recipeforge export --format torchao-int4` quantizes, so the trained weights lose less when exported.

`prepare` swaps each decoder linear layer for torchao's `FakeQuantizedLinear` (the forward pass sees
its weights rounded to int4 per group, and for `int8_dynamic_act_int4_weight` its inputs rounded to
int8 per token; gradients pass straight through); `strip` swaps them back to plain `nn.Linear` before
final/ is written, so the saved safetensors are ordinary full-precision weights that the export,
transformers and every serving engine load. torch and torchao are imported inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.errors import Location, RecipeError
from recipeforge.stage_specs import Names

if TYPE_CHECKING:
    import torch

INSTALL = "pip install 'recipeforge[torchao]'"


class QATScheme(Names):
    """What `train.qat.scheme` fake-quantizes."""

    INT4_WEIGHT = "int4_weight"                                    # int4 weights per group (torchao-int4's)
    INT8_DYNAMIC_ACT_INT4_WEIGHT = "int8_dynamic_act_int4_weight"  # and int8 activations per token (torchao-int8-int4's)


QAT_SCHEMES = tuple(s.value for s in QATScheme)
# The `recipeforge export --format` whose quantization each scheme simulates exactly (the same torchao config,
# `base_config`, in the groups the run trained).
EXPORT_FORMATS = {QATScheme.INT4_WEIGHT: "torchao-int4", QATScheme.INT8_DYNAMIC_ACT_INT4_WEIGHT: "torchao-int8-int4"}


def export_format(scheme: str) -> str:
    """The export format a run trained with `train.qat.scheme` = `scheme` is meant for."""
    return EXPORT_FORMATS[QATScheme(scheme)]


def check_torchao(location: Location | None = None) -> None:
    """Refuse `train.qat` before anything loads when torchao is not installed."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        raise RecipeError("train.qat fake-quantizes with torchao, which is not installed", key="train.qat",
                          location=location, hint=f"{INSTALL}, or drop train.qat")


def base_config(scheme: str, group_size: int) -> Any:
    """The torchao post-training config whose quantization `scheme` simulates: int4 weights are
    torchao's `IntxWeightOnlyConfig(torch.int4, PerGroup)`, symmetric, the config `export --format
    torchao-int4` writes with (`tools.exporters.writers.torchao_config`)."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, PerGroup

    int4 = torch.int4  # type: ignore[attr-defined]  # a torch dtype its stubs do not declare
    if QATScheme(scheme) == QATScheme.INT4_WEIGHT:
        return IntxWeightOnlyConfig(weight_dtype=int4, granularity=PerGroup(group_size))
    return Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, weight_granularity=PerGroup(group_size))


def quantized_linears(model: torch.nn.Module) -> list[str]:
    """Names of the linear layers the torchao export quantizes: every `nn.Linear` but the output head
    (transformers' `TorchAoConfig` default; embeddings are not linear layers)."""
    import torch

    # a transformers model names its output head; a bare module has none
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head]


def check_group_size(model: torch.nn.Module, group_size: int, location: Location | None = None) -> None:
    """Refuse a group size that does not divide every quantized layer's input width (torchao groups
    the input features of each output row)."""
    import torch

    names = set(quantized_linears(model))
    bad = sorted({m.in_features for n, m in model.named_modules()
                  if n in names and isinstance(m, torch.nn.Linear) and m.in_features % group_size})
    if bad:
        fits = [g for g in (256, 128, 64, 32, 16) if all(w % g == 0 for w in {m.in_features for n, m in
                                                                             model.named_modules() if n in names})]
        raise RecipeError(f"train.qat.group_size {group_size} does not divide the input width of the model's "
                          f"linear layers ({', '.join(map(str, bad))})", key="train.qat.group_size",
                          location=location, hint=f"use one of {', '.join(map(str, fits))}" if fits
                          else "use a group size dividing every linear layer's input width")


def prepare(model: torch.nn.Module, scheme: str, group_size: int) -> int:
    """Fake-quantize `model`'s exported linear layers in place (torchao `QATConfig(step="prepare")`);
    returns how many layers were swapped."""
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig

    names = set(quantized_linears(model))
    quantize_(model, QATConfig(base_config(scheme, group_size), step="prepare"),
              filter_fn=lambda _module, fqn: fqn in names)
    return len(names)


def is_prepared(model: torch.nn.Module) -> bool:
    """Whether `model` holds torchao fake-quantized layers."""
    from torchao.quantization.qat.linear import FakeQuantizedLinear

    return any(isinstance(m, FakeQuantizedLinear) for m in model.modules())


def strip(model: torch.nn.Module) -> None:
    """Swap the fake-quantized layers back to plain `nn.Linear` (the same weights, in place): torchao's
    `QATConfig(step="convert")` without a base config does the module swap only, quantizing nothing."""
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig
    from torchao.quantization.qat.linear import FakeQuantizedLinear

    quantize_(model, QATConfig(step="convert"), filter_fn=lambda module, _fqn: isinstance(module, FakeQuantizedLinear))
