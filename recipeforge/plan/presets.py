"""Named backend presets (``zero2``, ``zero3_offload``, ``fsdp_full_shard``, ``tp2_pp4`` ...): lookup.

Each backend spec declares its presets and what each stands for (`capabilities.Preset`: ZeRO stage,
offload, FSDP sharding, TP/PP), so a recipe pinning ``distributed.preset: zero3_offload`` and a plan
choosing it run the same way; the planner owns the list of presets a target can use
(`plan.policy.known_presets`). Pure data, no heavy imports.
"""

from __future__ import annotations

from recipeforge.capabilities import Preset, find_preset, preset_names
from recipeforge.errors import RecipeError, did_you_mean

__all__ = ["Preset", "get_preset", "known_preset_names"]


def get_preset(name: str, *, backend: str | None = None) -> Preset:
    """The preset called `name` (of `backend`, when given); an unknown name is a `RecipeError`
    listing the known ones."""
    preset = find_preset(name, backend)
    if preset is None:
        known = known_preset_names(backend)
        hint = did_you_mean(name, known)
        raise RecipeError(f"unknown preset '{name}'" + (f" for backend {backend}" if backend not in (None, "auto") else ""),
                          key="distributed.preset",
                          hint=(hint + " " if hint else "") + f"known presets: {', '.join(known)}")
    return preset


def known_preset_names(backend: str | None = None) -> list[str]:
    """Preset names (a generated family, e.g. Megatron's, as its pattern ``tp{T}_pp{P}[_offload]``)."""
    return preset_names(backend)
