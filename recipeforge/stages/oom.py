"""Out of GPU memory at run time: measure what the device had and held, and answer with the plan.

The explanation itself (the plan's numbers, and what the planner picks once told how far off it
was) lives in `plan.oom`; this module only reads the facts from torch.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.stages.base import TrainerStage
    from recipeforge.stages.context import StageContext

_TRIED = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_TRIED_CPU = re.compile(r"you tried to allocate (\d+) bytes")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is PyTorch (or a library on top of it) running out of accelerator memory."""
    try:
        import torch
    except ImportError:
        return False
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        sign in text for sign in ("CUDA out of memory", "CUDA error: out of memory", "DefaultCPUAllocator: not enough memory"))


def out_of_memory_error(ctx: StageContext, runner: TrainerStage, exc: BaseException) -> RecipeError:
    """The user error for `exc` raised while `runner` trained `ctx`'s plan (a `StageContext`); the step
    is the trainer's, when the trainer was built."""
    from recipeforge.outputs import checkpoint
    from recipeforge.plan.oom import explain_oom

    capacity, peak = _device_memory(str(exc))
    step = runner.trainer.state.global_step if runner.trainer is not None else None
    newest = checkpoint.newest_complete(ctx.run.checkpoints)
    return explain_oom(ctx.recipe, ctx.plan, step=step, capacity_bytes=capacity, peak_bytes=peak,
                       checkpoint=str(newest.relative_to(ctx.run.root)) if newest is not None else None)


def _device_memory(message: str) -> tuple[float | None, float | None]:
    """(total memory of the device that ran out, bytes held at peak plus the failed allocation): this
    process's GPU, or on a CPU-only run the machine's RAM and the process's peak resident size."""
    import torch

    if not torch.cuda.is_available():
        try:
            import resource

            total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
            peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        except (ImportError, ValueError, OSError):
            return None, None
        m = _TRIED_CPU.search(message)
        return total, peak + (float(m.group(1)) if m else 0.0)
    device = torch.cuda.current_device()
    total = float(torch.cuda.get_device_properties(device).total_memory)
    m = _TRIED.search(message)
    tried = float(m.group(1)) * _UNITS[m.group(2)] if m else 0.0
    return total, float(torch.cuda.max_memory_reserved(device)) + tried
