"""Recipes for planner tests, built from small dicts and validated by the real schema."""

from __future__ import annotations

from recipeforge.config.schema import recipe_adapter

_FORMATS = {"sft": "alpaca", "pretrain": "text", "dpo": "preference", "grpo": "prompt"}


def build_recipe(model_name: str = "tiny:llama", stage: str = "sft", **sections):
    """A validated recipe for `model_name` and `stage`; keyword arguments are top-level sections
    (``adapter={...}``, ``train={...}``, ...) merged over a minimal valid recipe."""
    data = {"datasets": [{"path": "data.jsonl", "format": _FORMATS[stage]}]}
    data.update(sections.pop("data", {}))
    raw = {"stage": stage, "model": {"name_or_path": model_name, **sections.pop("model", {})}, "data": data}
    if stage == "grpo":
        raw["grpo"] = {"rewards": [{"name": "exact_match"}], **sections.pop("grpo", {})}
    raw.update(sections)
    return recipe_adapter().validate_python(raw)


def bound_layout(backend: str, preset: str | None = None, **sizes):
    """A `Layout` built by hand, sized by its installed backend's spec (as a planner-offered one is)."""
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.planners import Planners

    return Planners.installed().bind(Layout(backend, preset, **sizes))
