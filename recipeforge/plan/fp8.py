"""FP8 training (`train.precision: fp8`) in the plan: where it can run, which layers convert, and
what it changes in the memory model.

torchao's `Float8Linear` (components.fp8) leaves the weights as they are (fp32 masters under
autocast on one GPU or DDP, FSDP2's fp32 shards) and casts a layer's input, weight and output
gradient to float8 inside its matmuls. It saves the high-precision input and weight for backward
and casts them again there, so the activations kept for backward stay bf16 here as well; what
fp8 adds are the float8 casts of one layer at a time (its weight, its input and its output
gradient at one byte each) and one fp32 scale per tensor (tensorwise) or per row (rowwise), which
the planner counts with the casts. With FSDP2 and tensorwise scaling the converted layers'
weights are all-gathered in float8: one byte a parameter instead of two in the gathered layer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from recipeforge.components.fp8 import DIVISOR, eligible
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import Hardware
from recipeforge.plan.types import Choice

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.linear import Linear
    from recipeforge.plan.models import ModelSpec
    from recipeforge.plan.workload import Workload

FP8_GPUS = "L4, L40S, RTX 4090, H100, H200, B200"


def check_hardware(recipe: Recipe, hw: Hardware) -> None:
    """Refuse `train.precision: fp8` for planned hardware without float8 tensor cores."""
    if recipe.train.precision != "fp8":
        return
    if hw.device != "cuda":
        raise RecipeError("train.precision fp8 needs a GPU with float8 tensor cores, and this plan is for the "
                          "CPU", key="train.precision",
                          hint=f"plan for such a GPU (--hardware 8xH100-80GB; {FP8_GPUS}), or set "
                               f"train.precision: auto")
    assert hw.accelerator is not None  # a GPU target has one (`Hardware.device`)
    if not hw.accelerator.fp8:
        raise RecipeError(f"train.precision fp8 needs float8 tensor cores (compute capability 8.9 or newer), "
                          f"and the {hw.accelerator.name} has none", key="train.precision",
                          hint=f"plan for a GPU that has them ({FP8_GPUS}), or set train.precision: auto "
                               f"(bf16 mixed precision)")


def converted(model: ModelSpec) -> list[Linear]:
    """The linears of one decoder layer that become `Float8Linear` (`nn.Linear` modules, dims
    multiples of 16)."""
    return [lin for lin in model.nn_linears() if eligible(lin.in_features, lin.out_features)]


def kept(model: ModelSpec) -> list[Linear]:
    """The `nn.Linear` modules of one decoder layer that stay bf16 (a dim not a multiple of 16)."""
    return [lin for lin in model.nn_linears() if not eligible(lin.in_features, lin.out_features)]


def layer_params(model: ModelSpec) -> int:
    """Weight parameters of one decoder layer that compute in float8."""
    return sum(lin.count * lin.in_features * lin.out_features for lin in converted(model))


def gathers_fp8(recipe: Recipe) -> bool:
    """Whether FSDP2 would all-gather the converted weights in float8: asked for, tensorwise scaling,
    and a model loaded whole (a model made or loaded shard by shard converts after sharding, and
    gathers in bf16)."""
    from recipeforge.components.tiny_spec import tiny_arch

    s = recipe.train.fp8_settings()
    whole = recipe.model.init != "random" and tiny_arch(recipe.model.name_or_path) is None
    return s.all_gather and s.scaling == "tensorwise" and whole


def fp8_workload(recipe: Recipe, w: Workload) -> Workload:
    """`w` with fp8 training: mixed precision (fp32 masters on one GPU or DDP) and the float8 terms."""
    if w.vision is not None:
        raise RecipeError("train.precision fp8 converts a language model's decoder layers, and this is a "
                          "vision-language model (its tower's layers are not planned for float8)",
                          key="train.precision", hint="set train.precision: auto")
    return replace(w, fp32_master=True, fp8_layer_params=layer_params(w.model), fp8_gather=gathers_fp8(recipe))


def cast_bytes(w: Workload, tokens: int) -> float:
    """The float8 casts alive in one converted layer's matmuls: its weight, its input and its output
    gradient, one byte an element, with their scales (4 bytes per row for rowwise; one per tensor
    is negligible)."""
    lins = converted(w.model)
    if not w.fp8_layer_params or not lins:
        return 0.0
    widest = max(lins, key=lambda lin: lin.in_features * lin.out_features)
    weight = widest.in_features * widest.out_features
    act = tokens * (widest.in_features + widest.out_features)
    # rowwise: an fp32 scale per row of each operand (tokens of the input and gradient, rows of the weight)
    scales = 4 * (2 * tokens + widest.out_features + widest.in_features)
    return float(weight + act + scales)


def gathered_layer_saving(w: Workload, tensor_parallel: int) -> float:
    """Bytes FSDP2's float8 all-gather saves in one gathered decoder layer (per GPU, before tensor
    parallel splits): one byte a converted weight instead of the compute dtype's."""
    if not w.fp8_gather or tensor_parallel > 1:
        return 0.0
    return float(w.fp8_layer_params * (w.compute_bytes - 1))


def reason(recipe: Recipe, w: Workload, shards_weights: bool, tensor_parallel: int) -> Choice:
    """The plan's `fp8` entry: the scaling, what converts and what stays bf16, and the all-gather
    (`shards_weights`: the chosen layout gathers sharded weights, FSDP2 here since DeepSpeed and
    Megatron are refused)."""
    m, s = w.model, recipe.train.fp8_settings()
    lins = converted(m)
    names = ", ".join(lin.name for lin in lins) or "none"
    stay = ["the LM head (output layer)", "the embeddings", "the norms"]
    odd = kept(m)
    if odd:
        stay.append("layers with a dim not a multiple of " + str(DIVISOR) + " ("
                    + ", ".join(f"{lin.name} {lin.in_features}x{lin.out_features}" for lin in odd) + ")")
    if w.model.is_moe:
        stay.append("the routers and routed experts (plain parameters, not nn.Linear)")
    if shards_weights and s.all_gather:
        gather = ("FSDP2 all-gathers the converted weights in float8 (half the bytes), scales refreshed after "
                  "each optimizer step" if gathered_layer_saving(w, tensor_parallel) else
                  "FSDP2 all-gathers in bf16 (float8 all-gather needs tensorwise scaling, no tensor "
                  "parallelism and a model loaded whole)")
    else:
        gather = "no float8 all-gather (FSDP2 only)"
    rowwise = "; rowwise runs fast only compiled (kernels.torch_compile)" if s.scaling == "rowwise" else ""
    return Choice(s.scaling, f"recipe sets train.precision: fp8: {len(lins)} linear layers per decoder layer "
                             f"({names}, {m.num_layers} layers) compute in float8 e4m3 with dynamic "
                             f"{s.scaling} scales (torchao); bf16 stay {', '.join(stay)}; weights and optimizer "
                             f"states as mixed precision keeps them; activations saved for backward stay bf16 "
                             f"(torchao recasts them in backward); {gather}{rowwise}")
