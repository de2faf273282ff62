"""The recipe's pins checked before any layout is searched: a pinned backend's capability record, a pinned
preset, pinned parallel sizes, and the hardware an fp8 or optimizer-in-backward recipe needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.capabilities import parallel_key
from recipeforge.capabilities import refusals as capability_refusals
from recipeforge.config.schema.distributed import PARALLEL_SIZE_KEYS
from recipeforge.errors import RecipeError, did_you_mean
from recipeforge.plan.fp8 import check_hardware as check_fp8_hardware
from recipeforge.plan.optim_in_backward import check_in_backward_hardware
from recipeforge.plan.parallel_layouts import check_pinned_sizes
from recipeforge.plan.policy import known_presets
from recipeforge.plan.presets import get_preset

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.planners import Planners
    from recipeforge.plan.workload import Workload


def check_recipe_pins(recipe: Recipe, w: Workload, hw: Hardware, planners: Planners) -> None:
    """Refuse (`RecipeError` at the key) what the recipe pins and this hardware or backend cannot run."""
    check_pins(recipe, w, hw, planners)
    check_pinned_sizes(w, hw, recipe.distributed, planners)
    check_fp8_hardware(recipe, hw)
    check_in_backward_hardware(recipe.train.optimizer_in_backward, recipe.distributed.backend, hw)


def check_pins(recipe: Recipe, w: Workload, hw: Hardware, planners: Planners) -> None:
    """A pinned backend's capability record and a pinned preset, checked against the recipe."""
    dist = recipe.distributed
    if dist.backend != "auto":
        # The pinned backend's capability record, the same one the recipe rules and `check()` read;
        # a pinned preset stands for its ZeRO stage and offload.
        zero: int | str = dist.zero_stage  # a preset's stage (an int) may replace the recipe's (or `auto`)
        offload: str = dist.offload
        if dist.preset:
            preset = get_preset(dist.preset, backend=dist.backend)
            zero = preset.zero_stage if preset.zero_stage is not None else zero
            offload = preset.offload
        found = capability_refusals(planners.capabilities(dist.backend), stage=recipe.stage, device=hw.device,
                                    adapter=w.adapter, quant_bits=w.quant_bits, offload=offload,
                                    zero_stage=zero, optimizer=w.optimizer,
                                    model_parallel=parallel_key(dist.tensor_parallel, dist.pipeline_parallel,
                                                                dist.context_parallel))
        if found:
            raise found[0].error()
    if dist.preset and hw.device == "cuda":
        presets = known_presets(w, hw, planners, dist.backend)
        if dist.preset not in presets:
            raise RecipeError(f"unknown preset '{dist.preset}' for backend {dist.backend} on {hw.describe()}",
                              key="distributed.preset",
                              hint=(did_you_mean(dist.preset, presets) or "") + f" presets: {', '.join(presets)}")


def pinned(recipe: Recipe) -> list[str]:
    """The `distributed` keys the recipe pins, as `key: value` texts for reasons and errors."""
    d = recipe.distributed
    out = []
    if d.backend != "auto":
        out.append(f"backend: {d.backend}")
    if d.preset:
        out.append(f"preset: {d.preset}")
    if d.zero_stage != "auto":
        out.append(f"zero_stage: {d.zero_stage}")
    if d.offload != "auto":
        out.append(f"offload: {d.offload}")
    if d.pipeline_parallel > 1:
        out.append(f"pipeline_parallel: {d.pipeline_parallel}")
    for key in PARALLEL_SIZE_KEYS:
        if d.pinned_size(key) is not None:
            out.append(f"{key}: {d.pinned_size(key)}")
    return out
