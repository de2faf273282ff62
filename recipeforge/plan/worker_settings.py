"""The reasons that carry a worker's settings (it reads each from its reason's value): the precision, TF32,
added tokens, fp8 and the mixture-of-experts implementation and expert parallel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.plan.experts import expert_reasons, expert_warnings
from recipeforge.plan.fp8 import reason as fp8_reason
from recipeforge.plan.precision import tf32_choice
from recipeforge.plan.vocab import vocab_choice

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.policy import Evaluation
    from recipeforge.plan.types import Choice
    from recipeforge.plan.workload import Workload


def worker_settings(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation,
                    precision: Choice) -> tuple[dict[str, Choice], list[str]]:
    """The reasons workers read their settings from, in print order, and the warnings they raise."""
    # Workers read the precision from its reason's value (`stages.precision`); tf32 is settled on the GPU.
    added = {"precision": precision, "tf32": tf32_choice(recipe, hw), "added_tokens": vocab_choice(recipe),
             "fp8": fp8_reason(recipe, w, ev.layout.spec.shards_weights(ev.layout), ev.layout.tensor_parallel)
             if recipe.train.precision == "fp8" else None}
    moe = expert_reasons(recipe, w, hw, ev)  # MoE models: experts implementation, expert parallel
    added.update(moe)
    return {k: v for k, v in added.items() if v is not None}, expert_warnings(moe, ev)
