"""What LoRA adapts on a mixture-of-experts model, for the workload (`plan.workload`) and the plan's
reasons (`plan.experts`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.plan.linear import Linear

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.models import ModelSpec


def expert_lora_linears(model: ModelSpec) -> tuple[Linear, ...]:
    """The routed experts' projections `moe.lora_experts` adapts (peft `target_parameters`: one
    low-rank pair per expert on each fused 3-D weight)."""
    return tuple(lin for lin in model.layer_linears() if lin.name.startswith("experts.")) if model.is_moe else ()


def experts_adapted(recipe: Recipe) -> bool:
    """Whether LoRA reaches the routed experts (`moe.lora_experts`; unset: when adapter.dropout is 0)."""
    a, flag = recipe.adapter, recipe.moe.lora_experts
    return a.type != "none" and (bool(flag) if flag is not None else not a.dropout)
