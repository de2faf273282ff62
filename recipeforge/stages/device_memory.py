"""Peak GPU memory of this process, logged with every training record.

The figures are the ones `recipeforge plan` is compared against: `torch.cuda.max_memory_reserved`
(what the caching allocator holds, fragmentation included) and `max_memory_allocated` (live
tensors), in GiB, since the start of the run. On a CPU the source logs nothing.
"""

from __future__ import annotations

from typing import Callable

GIB = 1024 ** 3


def peak_memory_source(device: str) -> Callable[[], dict[str, float]] | None:
    """A log source returning this process's peak GPU memory so far, or None off CUDA."""
    if device != "cuda":
        return None
    import torch

    if not torch.cuda.is_available():
        return None

    def take() -> dict[str, float]:
        index = torch.cuda.current_device()
        return {"memory/peak_reserved_gib": round(torch.cuda.max_memory_reserved(index) / GIB, 3),
                "memory/peak_allocated_gib": round(torch.cuda.max_memory_allocated(index) / GIB, 3)}

    return take
