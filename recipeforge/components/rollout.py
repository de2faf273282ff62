"""GRPO rollout engines, from the `rollout_engines` registry (group ``recipeforge.rollout_engines``).

An engine turns `grpo.rollout` into GRPO trainer arguments. The built-in ``hf`` engine generates
with the training model's own `generate` (works everywhere, CPU included); a plugin can add e.g.
``vllm`` by returning TRL's vLLM arguments.
"""

from __future__ import annotations

from typing import Any, Callable

from recipeforge.errors import Location, RecipeError, did_you_mean
from recipeforge.registry import Registry

# engine(rollout_config, device) -> GRPO trainer keyword arguments
RolloutEngine = Callable[[Any, str], dict]
rollout_engines: Registry[RolloutEngine] = Registry("rollout_engines")


def hf_engine(rollout, device: str) -> dict:
    """Plain transformers generation with the policy being trained."""
    return {"use_vllm": False}


rollout_engines.register("hf", hf_engine)


def rollout_arguments(rollout, device: str, *, location: Location | None = None) -> dict:
    """Trainer arguments of the engine `grpo.rollout.engine` names."""
    name = rollout.engine
    if name not in rollout_engines.names():
        known = rollout_engines.names()
        close = did_you_mean(name, known)
        raise RecipeError(f"unknown rollout engine '{name}'", key="grpo.rollout.engine", location=location,
                          hint=f"{close + ' ' if close else ''}available: {', '.join(known)}")
    return dict(rollout_engines.get(name, key="grpo.rollout.engine", location=location)(rollout, device))
