"""How full fine-tuning holds its trained weights (`train.precision`), decided with the memory model.

On one GPU or with DDP the Hugging Face Trainer trains the weights in the dtype they were loaded in:

- ``mixed``: fp32 weights, gradients and AdamW states, 16-bit compute under autocast (16 bytes per
  parameter plus the 16-bit weight copies autocast keeps for backward); what fp16 always needs;
- ``pure_bf16``: bf16 weights, gradients and AdamW states (8 bytes per parameter); an update smaller
  than a weight's bf16 spacing rounds away;
- ``pure_bf16_sr``: as pure bf16, with torchao's AdamW rounding each update stochastically, so small
  updates survive on average.

DeepSpeed, FSDP and Megatron keep fp32 master weights themselves, and peft trains adapters in fp32:
there the precision is theirs. `auto` picks mixed whenever some layout fits without offload, else
pure bf16 on one GPU or DDP when that fits.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import GIB, Hardware
from recipeforge.plan.types import Choice
from recipeforge.plan.workload import Workload

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.policy import Decision

    # (workload as it will train, the layout decision for it, `Choice` of precision)
    Precision = tuple[Workload, Decision, Choice]


def holds_weights(layout: Layout) -> bool:
    """Whether the Trainer itself holds the weights on `layout` (one device, DDP): precision is then
    the run's to choose, where an engine keeps fp32 master weights itself."""
    holds: bool = layout.spec.trainer_holds_weights
    return holds


def _replica_backends(planners: Mapping[str, Any]) -> str:
    names = [n for n, spec in planners.items() if getattr(spec, "trainer_holds_weights", False)]
    return " or ".join(names)


PURE = ("pure_bf16", "pure_bf16_sr")
SR_OPTIMIZERS = ("adamw", "adamw_fused")


def choose_precision(recipe: Recipe, w: Workload, device: str, decide: Callable[[Workload], Decision],
                     planners: Mapping[str, Any]) -> Precision:
    """(workload as it will train, the layout decision for it, `Choice` of precision).

    `decide(workload)` is the policy's layout decision; `auto` may ask it twice (mixed, then pure bf16).
    `planners`: the backends it chooses among (named in the hint of a refused pinned precision).
    Raises `RecipeError` for a pinned precision the run cannot honour."""
    pinned = recipe.train.precision
    if pinned == "fp8":
        return _fp8_precision(recipe, w, decide)
    pure = pinned in PURE
    if pure:
        _check_pure(recipe, w, pinned)
    settled = _settled_precision(w, device, pinned, decide)
    if settled is not None:
        return settled
    if pure:
        return _pinned_pure(w, pinned, decide, planners)
    return _auto_precision(w, decide)


def _settled_precision(w: Workload, device: str, pinned: str,
                       decide: Callable[[Workload], Decision]) -> Precision | None:
    """The choice where the dtype, an adapter, the CPU or a pinned `mixed` leaves no other (None where
    pure bf16 is still possible on a GPU)."""
    if w.dtype == "fp32":
        return w, decide(w), Choice("fp32", "model.dtype fp32: weights, gradients and optimizer states in fp32, "
                                            "no autocast")
    if not w.full_finetune:
        return w, decide(w), Choice("mixed", f"the adapter trains in fp32 (peft) on a frozen {w.dtype} base, "
                                             f"{w.dtype} compute")
    mixed_w = replace(w, fp32_master=True)
    if w.dtype == "fp16":
        return mixed_w, decide(mixed_w), Choice("mixed", "fp16 needs fp32 master weights (loss scaling, fp16 "
                                                         "autocast)")
    if device == "cpu":
        if pinned == "mixed":
            raise RecipeError("train.precision mixed needs a GPU: the Trainer has no bf16 autocast on the CPU",
                              key="train.precision",
                              hint="set model.dtype: fp32 for full precision on the CPU, or train.precision: pure_bf16")
        mode = pinned if pinned in PURE else "pure_bf16"
        return w, decide(w), Choice(mode, "bf16 weights train as they are on the CPU (no autocast there)")
    if pinned == "mixed":
        return mixed_w, decide(mixed_w), Choice("mixed", "recipe sets it: fp32 master weights, gradients and "
                                                         "AdamW states; bf16 autocast compute")
    return None


def _fp8_precision(recipe: Recipe, w: Workload, decide: Callable[[Workload], Decision]) -> Precision:
    """`train.precision: fp8`: mixed precision (fp32 masters where the Trainer holds the weights,
    the engine's own elsewhere) with the float8 matmuls of `plan.fp8`; the recipe rules refuse
    adapters and fp32/fp16 compute, `plan.fp8.check_hardware` the device."""
    from recipeforge.plan.fp8 import fp8_workload

    if not w.full_finetune or w.dtype != "bf16":
        raise RecipeError(f"train.precision fp8 applies to full fine-tuning in bf16 (here: {w.adapter} adapter, "
                          f"{w.dtype})", key="train.precision",
                          hint="set adapter.type: none and model.dtype: bf16, or train.precision: auto")
    fw = fp8_workload(recipe, w)
    return fw, decide(fw), Choice("fp8", "recipe sets it: float8 matmuls in the eligible linear layers (see fp8); "
                                         "fp32 master weights, gradients and optimizer states; bf16 compute "
                                         "elsewhere")


def _pinned_pure(w: Workload, pinned: str, decide: Callable[[Workload], Decision],
                 planners: Mapping[str, Any]) -> Precision:
    """A pinned pure bf16 precision on a GPU; refused where the chosen layout keeps fp32 master weights."""
    decision = decide(w)
    chosen = getattr(decision, "chosen", None)
    if chosen is not None and not holds_weights(chosen.layout):
        raise RecipeError(f"train.precision {pinned} applies to one GPU or DDP, and this plan runs "
                          f"{chosen.layout.label}, which keeps fp32 master weights itself",
                          key="train.precision",
                          hint=f"set train.precision: auto, or distributed.backend: {_replica_backends(planners)}")
    sr = " with stochastically rounded updates (torchao AdamW)" if pinned == "pure_bf16_sr" else ""
    return w, decision, Choice(pinned, f"recipe sets it: bf16 weights, gradients and AdamW states{sr}")


def _auto_precision(w: Workload, decide: Callable[[Workload], Decision]) -> Precision:
    """`auto` for bf16 full fine-tuning on a GPU: mixed where it fits on the GPUs, else pure bf16."""
    mixed_w = replace(w, fp32_master=True)
    # auto: fp32 master weights whenever some layout holds them without offload
    mixed_decision = decide(mixed_w)
    chosen = getattr(mixed_decision, "chosen", None)
    if chosen is not None and chosen.layout.offload == "none":
        if holds_weights(chosen.layout):
            why = (f"auto: fp32 master weights fit ({chosen.layout.label}, {chosen.memory.total / GIB:.1f} GB "
                   f"per GPU); bf16 autocast compute")
        else:
            why = f"auto: {chosen.layout.backend} keeps fp32 master weights and computes in bf16"
        return mixed_w, mixed_decision, Choice("mixed", why)
    pure_decision = decide(w)
    pchosen = getattr(pure_decision, "chosen", None)
    if pchosen is not None and holds_weights(pchosen.layout):
        lost = ("needs CPU offload (" + chosen.layout.label + ")" if chosen is not None
                else "fit in no layout")
        return w, pure_decision, Choice(
            "pure_bf16", f"auto: with fp32 master weights the run {lost}; bf16 weights, gradients and AdamW "
                         f"states fit ({pchosen.layout.label}, {pchosen.memory.total / GIB:.1f} GB per GPU). "
                         f"Updates below bf16's resolution round away: train.precision pure_bf16_sr rounds "
                         f"them stochastically (torchao)")
    return mixed_w, mixed_decision, Choice("mixed", "auto: fp32 master weights" + (
        f" ({chosen.layout.label} with CPU offload; pure bf16 fits no single-GPU or DDP layout either)"
        if chosen is not None else ""))


def _check_pure(recipe: Recipe, w: Workload, pinned: str) -> None:
    if w.dtype != "bf16":
        raise RecipeError(f"train.precision {pinned} keeps the weights in bf16, and model.dtype resolves to "
                          f"{w.dtype} here", key="train.precision",
                          hint="set model.dtype: bf16, or train.precision: auto")
    if not w.full_finetune:
        raise RecipeError(f"train.precision {pinned} applies to full fine-tuning; peft trains the adapter in fp32",
                          key="train.precision", hint="remove train.precision, or set adapter.type: none")
    if pinned == "pure_bf16_sr" and recipe.train.optimizer not in SR_OPTIMIZERS:
        raise RecipeError(f"train.precision pure_bf16_sr uses torchao's AdamW, and train.optimizer is "
                          f"{recipe.train.optimizer}", key="train.precision",
                          hint="set train.optimizer: adamw, or train.precision: pure_bf16")


def tf32_choice(recipe: Recipe, hw: Hardware) -> Choice | None:
    """What `train.tf32` will do on the target (the worker decides on the GPU's compute capability)."""
    setting = recipe.train.tf32
    if hw.device != "cuda":
        return None
    if setting is not True and setting is not False:
        ampere = hw.accelerator is not None and hw.accelerator.vendor == "nvidia" and hw.accelerator.bf16
        assert hw.accelerator is not None  # a GPU target has one (`Hardware.device`)
        return Choice(ampere, f"auto: {'on' if ampere else 'off'}, {hw.accelerator.name} "
                              f"{'is' if ampere else 'is not'} Ampere or newer (compute capability 8.0; "
                              f"checked again on the GPU at run time)")
    return Choice(setting, "recipe sets it")
