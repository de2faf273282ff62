"""Optional kernels (`kernels:` in a recipe), from the `kernels` registry (group ``recipeforge.kernels``).

A kernel is a `KernelSpec`: its options (a pydantic model; the recipe's ``kernels.<name>:`` mapping
is validated against it when the recipe loads) and how it applies on a device, as trainer arguments
or a reason to skip. GPU-only kernels are skipped on CPU runs with a logged reason, never switched
on there. Built in: ``flash_attn`` and ``torch_compile``; Liger kernels come from the
recipeforge-liger plugin. This module stays light (no torch): recipe validation imports it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recipeforge.errors import RecipeError
from recipeforge.registry import Registry


@dataclass
class KernelEffects:
    """What the enabled kernels change."""

    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    enabled: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)   # name -> why


@dataclass(frozen=True)
class KernelSpec:
    """A kernel: ``apply(options, device) -> (trainer kwargs, None)`` when it applies, or
    ``({}, reason)`` when it is skipped on this device. `options` is the pydantic model of its
    recipe options (``apply`` then receives a validated instance); None passes the raw mapping."""

    name: str
    apply: Callable[[Any, str], "tuple[dict, str | None]"]
    options: Optional[type[BaseModel]] = None
    description: str = ""
    gpu_only: bool = False


def _as_kernel(name: str, obj: object) -> KernelSpec:
    """A registered object as a `KernelSpec` (plain functions are kernels without an options model)."""
    if isinstance(obj, KernelSpec):
        return obj
    if callable(obj):
        return KernelSpec(name, obj, getattr(obj, "options", None), (obj.__doc__ or "").strip().split("\n")[0])
    raise TypeError(f"a kernel must be a KernelSpec or a function (options, device) -> (kwargs, reason), "
                    f"got {type(obj).__name__}")


kernels: Registry[KernelSpec] = Registry("kernels", coerce=_as_kernel)


class Options(BaseModel):
    """Base of the built-in option models: strict like a recipe section (plugins may use
    `recipeforge.config.schema.base.Section`, which is the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoOptions(Options):
    """A kernel without options: any key under it is an error."""


class TorchCompileOptions(Options):
    """`kernels.torch_compile`: how transformers' Trainer compiles the model."""

    mode: Optional[Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]] = Field(
        None, description="torch.compile mode (default: torch's own).")
    backend: Optional[str] = Field(None, min_length=1, description="torch.compile backend (default: inductor).")


def _flash_attn(options: NoOptions, device: str):
    # The attention implementation itself is chosen when the model loads: with the kernel on,
    # model.attn_implementation `auto` resolves to flash_attention_2 on a GPU that has flash-attn
    # (components.models); the recipe rules refuse an explicit non-flash attention next to it.
    if device != "cuda":
        return {}, "flash-attention needs a CUDA GPU"
    if importlib.util.find_spec("flash_attn") is None:
        raise RecipeError("kernel flash_attn needs the flash-attn package, which is not installed",
                          key="kernels.flash_attn",
                          hint="pip install 'recipeforge[flash]', or remove flash_attn from kernels")
    return {}, None


def _torch_compile(options: TorchCompileOptions, device: str):
    kwargs: dict[str, Any] = {"torch_compile": True}
    if options.mode:
        kwargs["torch_compile_mode"] = options.mode
    if options.backend:
        kwargs["torch_compile_backend"] = options.backend
    return kwargs, None


kernels.register("flash_attn", KernelSpec("flash_attn", _flash_attn, NoOptions, gpu_only=True,
                                          description="FlashAttention 2 (attn_implementation: flash_attention_2)"))
kernels.register("torch_compile", KernelSpec("torch_compile", _torch_compile, TorchCompileOptions,
                                             description="torch.compile of the model (Trainer's torch_compile)"))


def kernel_options(spec: KernelSpec, options: Mapping[str, Any] | None, *, key: str) -> Any:
    """`options` validated against the kernel's model (the raw mapping when it has none)."""
    if spec.options is None:
        return dict(options or {})
    try:
        return spec.options.model_validate(dict(options or {}))
    except ValidationError as exc:  # normally caught when the recipe loads; kept for direct callers
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RecipeError(f"invalid options{' at ' + where if where else ''}: {first['msg']}", key=key) from None


def apply_kernels(requested: dict[str, dict], device: str, *, log=print) -> KernelEffects:
    """Resolve the recipe's kernels for `device`; unknown names raise a RecipeError listing known ones.

    A first-party kernel whose plugin is not installed (``liger`` without recipeforge-liger) is
    skipped on CPU runs, where it could not run anyway, and is an error on GPU runs.
    """
    effects = KernelEffects()
    for name, options in requested.items():
        plugin = kernels.first_party_plugin(name)
        if plugin is not None and device != "cuda":
            reason = f"runs on GPUs only (and its plugin {plugin} is not installed)"
            effects.skipped[name] = reason
            log(f"kernel '{name}' skipped: {reason}")
            continue
        spec = kernels.get(name, key=f"kernels.{name}")
        kwargs, skipped = spec.apply(kernel_options(spec, options, key=f"kernels.{name}"), device)
        if skipped:
            effects.skipped[name] = skipped
            log(f"kernel '{name}' skipped: {skipped}")
            continue
        effects.trainer_kwargs.update(kwargs)
        effects.enabled.append(name)
    return effects
