"""Optional kernels (`kernels:` in a recipe), from the `kernels` registry.

A kernel turns into trainer arguments and/or a note; GPU-only kernels are skipped on CPU runs with
a logged reason, never switched on there.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable

from recipeforge.registry import Registry


@dataclass
class KernelEffects:
    """What the enabled kernels change."""

    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    enabled: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)   # name -> why


# A kernel: (options, device) -> (trainer kwargs, None) when it applies, or ({}, reason) when skipped.
Kernel = Callable[[dict, str], "tuple[dict, str | None]"]
kernels: Registry[Kernel] = Registry("kernels")


def _liger(options: dict, device: str):
    if device != "cuda":
        return {}, "Liger kernels run on GPUs only (Triton)"
    if importlib.util.find_spec("liger_kernel") is None:
        return {}, "liger-kernel is not installed (pip install 'recipeforge[liger]')"
    return {"use_liger_kernel": True, **({"liger_kernel_config": options} if options else {})}, None


def _flash_attn(options: dict, device: str):
    # The attention implementation itself is chosen when the model loads (components.models).
    if device != "cuda":
        return {}, "flash-attention needs a CUDA GPU"
    if importlib.util.find_spec("flash_attn") is None:
        return {}, "flash-attn is not installed (pip install 'recipeforge[flash]')"
    return {}, None


def _torch_compile(options: dict, device: str):
    kwargs: dict[str, Any] = {"torch_compile": True}
    if options.get("mode"):
        kwargs["torch_compile_mode"] = options["mode"]
    if options.get("backend"):
        kwargs["torch_compile_backend"] = options["backend"]
    return kwargs, None


kernels.register("liger", _liger)
kernels.register("flash_attn", _flash_attn)
kernels.register("torch_compile", _torch_compile)


def apply_kernels(requested: dict[str, dict], device: str, *, log=print) -> KernelEffects:
    """Resolve the recipe's kernels for `device`; unknown names raise a RecipeError listing known ones."""
    effects = KernelEffects()
    for name, options in requested.items():
        kernel = kernels.get(name, key=f"kernels.{name}")
        kwargs, skipped = kernel(dict(options or {}), device)
        if skipped:
            effects.skipped[name] = skipped
            log(f"kernel '{name}' skipped: {skipped}")
            continue
        effects.trainer_kwargs.update(kwargs)
        effects.enabled.append(name)
    return effects
