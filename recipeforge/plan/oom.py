"""Explaining an out-of-memory failure at run time with the plan's numbers, and what would fit.

The plan said the run fits; the GPU said it does not. The gap between the two is measured (the
memory PyTorch held at its peak plus the allocation that failed, at least the whole GPU) and the
planner is asked again with a headroom that absorbs that gap: an estimate that was off by a factor
`r` is planned against `1/r` of the memory. What it then picks (smaller micro batch, recomputation,
another sharding) is what would fit. No torch here: the caller measures, this module explains.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import ACCELERATORS, GIB, Accelerator, Hardware
from recipeforge.plan.types import Plan

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe

SAFETY = 0.95          # of the GPU the re-plan may fill, after scaling by the observed underestimate
MIN_HEADROOM = 0.05


class OutOfMemory(RecipeError):
    """The run did not fit in memory after all (raised by whichever rank ran out)."""


def explain_oom(recipe: Recipe, plan: Plan, *, step: int | None, capacity_bytes: float | None = None,
                peak_bytes: float | None = None, checkpoint: str | None = None) -> OutOfMemory:
    """The user error for an out-of-memory failure of `plan` at `step` (None: before training).

    `capacity_bytes` is the memory of the device that ran out (default: what the plan assumed) and
    `peak_bytes` what the process needed at the failure (held at peak plus the failed allocation).
    """
    gpu = plan.device == "cuda"
    unit = "GPU" if gpu else "process"
    assumed = _planned_capacity(plan)
    capacity = capacity_bytes / GIB if capacity_bytes else assumed
    needed = max(capacity, (peak_bytes or 0) / GIB)
    estimate = float(plan.memory_gb.get("total") or 0.0)
    parts = ", ".join(f"{k.replace('_', ' ')} {_gb(v)}" for k, v in plan.memory_gb.items() if k != "total")
    when = f"at step {step}" if step is not None else "before training started"
    head = (f"out of {'GPU ' if gpu else ''}memory {when}: the plan estimated {_gb(estimate)} GB per {unit}"
            + (f" ({parts})" if parts else "") + f", and the run needed more than {_gb(needed)} GB")
    wrong_gpu = gpu and capacity_bytes is not None and abs(capacity - assumed) > 0.03 * assumed
    if wrong_gpu:
        head += (f"; the plan assumed {assumed:.1f} GB GPUs ({plan.reasons['hardware'].reason}) and this GPU "
                 f"has {capacity:.1f} GB")
    options = _options(recipe, plan, estimate=estimate, needed=needed, capacity=capacity, wrong_gpu=wrong_gpu)
    keep = (f"complete checkpoints are kept ({checkpoint}): change the recipe and rerun with --force to continue"
            if checkpoint else "no checkpoint was written yet: change the recipe and rerun")
    return OutOfMemory(head, hint="what would fit: " + "; ".join(options) + f". {keep[0].upper()}{keep[1:]}")


def _options(recipe: Recipe, plan: Plan, *, estimate: float, needed: float, capacity: float,
             wrong_gpu: bool) -> list[str]:
    from recipeforge.plan.plan import make_plan

    out: list[str] = []
    hw = _hardware(plan, capacity)
    base_keys = []
    if wrong_gpu:
        match = _accelerator_with(capacity)
        base_keys.append(f"hardware.gpu: {match.name}" if match else "hardware.gpu: the GPU this ran on")
    # The plan was off by needed/estimate; plan again against that share of the GPU.
    ratio = needed / estimate if estimate > 0 else 1.0
    headroom = min(recipe.distributed.memory_headroom, SAFETY / max(ratio, 1.0))
    headroom = max(MIN_HEADROOM, math.floor(headroom * 100) / 100)
    pinned = {k: v for k, v in (("train.micro_batch_size", recipe.train.micro_batch_size),
                                 ("train.gradient_checkpointing", recipe.train.gradient_checkpointing))
              if v != "auto" and not (k.endswith("checkpointing") and v is True)}
    attempts: list[dict[str, str]] = [{}]
    if pinned:
        attempts.append({k: "auto" for k in pinned})
    last: RecipeError | None = None
    for unpin in attempts:
        try:
            new = make_plan(_changed(recipe, headroom, unpin), hw)
        except RecipeError as exc:
            last = exc
            continue
        keys = base_keys + ([f"distributed.memory_headroom: {headroom:g}"]
                            if headroom != recipe.distributed.memory_headroom else []) + [f"{k}: auto" for k in unpin]
        keys = keys or [f"distributed.memory_headroom: {headroom:g}"]
        change = _describe(new, plan)
        if not change:
            continue
        out.append(f"{', '.join(keys)} (the planner then picks {change}; {_gb(new.memory_gb.get('total', 0))} GB "
                   "estimated)")
        if "train.micro_batch_size" in unpin and new.micro_batch_size < plan.micro_batch_size:
            out.append(f"or set train.micro_batch_size: {new.micro_batch_size} directly")
    if not out and last is not None:
        problem = last.problems[0]
        hint = (problem.hint or "").removeprefix("what would fit: ")
        out.append(f"with {', '.join(base_keys + [f'distributed.memory_headroom: {headroom:g}'])} nothing fits "
                   f"this recipe as it is ({problem.message})" + (f"; {hint}" if hint else ""))
    if not out:
        out.append("the planner has no smaller layout for this recipe: a shorter data.sequence_len, "
                   "train.micro_batch_size: 1, adapter.type: lora or qlora, or more memory per "
                   + ("GPU" if plan.device == "cuda" else "process"))
    return out


def _changed(recipe: Recipe, headroom: float, unpin: dict[str, str]) -> Recipe:
    train = recipe.train.model_copy(update={k.split(".", 1)[1]: v for k, v in unpin.items()})
    return recipe.model_copy(update={"distributed": recipe.distributed.model_copy(update={"memory_headroom": headroom}),
                                     "train": train})


def _describe(new: Plan, old: Plan) -> str:
    """What differs between two plans, in the plan's own terms."""
    parts = []
    if (new.backend, new.preset) != (old.backend, old.preset):
        parts.append(f"{new.backend}{f' {new.preset}' if new.preset else ''} (was {old.backend}"
                     f"{f' {old.preset}' if old.preset else ''})")
    if new.micro_batch_size != old.micro_batch_size:
        parts.append(f"micro batch {new.micro_batch_size} x accumulation {new.gradient_accumulation} "
                     f"(was {old.micro_batch_size} x {old.gradient_accumulation})")
    if new.gradient_checkpointing != old.gradient_checkpointing:
        parts.append(f"gradient checkpointing {'on' if new.gradient_checkpointing else 'off'}")
    if new.offload != old.offload:
        parts.append(f"offload {new.offload}")
    return ", ".join(parts)


def _gb(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def _planned_capacity(plan: Plan) -> float:
    hw = plan.extra.hardware or {}
    if plan.device == "cuda":
        return float((hw.get("accelerator") or {}).get("memory_gb") or 0.0)
    return float(hw.get("cpu_ram_gb") or plan.extra.memory_limit_gb or 0.0)


def _hardware(plan: Plan, capacity_gb: float) -> Hardware:
    """The plan's hardware, with the memory of the device that actually ran."""
    raw = plan.extra.hardware or {}
    acc = raw.get("accelerator")
    accelerator = None
    if acc:
        planned = Accelerator(**acc)
        accelerator = planned if abs(planned.memory_gb - capacity_gb) <= 0.03 * capacity_gb else (
            _accelerator_with(capacity_gb) or replace(planned, name=f"GPU-{capacity_gb:.0f}GB", memory_gb=capacity_gb))
        accelerator = replace(accelerator, memory_gb=capacity_gb)
    return Hardware(nodes=raw.get("nodes", plan.nodes), gpus_per_node=raw.get("gpus_per_node", plan.gpus_per_node),
                    accelerator=accelerator, cpu_ram_gb=raw.get("cpu_ram_gb") if acc else capacity_gb,
                    source=raw.get("source", "probe"))


def _accelerator_with(memory_gb: float) -> Accelerator | None:
    close = [a for a in ACCELERATORS.values() if abs(a.memory_gb - memory_gb) <= 0.03 * memory_gb]
    return min(close, key=lambda a: abs(a.memory_gb - memory_gb)) if close else None
