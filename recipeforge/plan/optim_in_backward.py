"""The memory of `train.optimizer_in_backward`: the optimizer step of each parameter runs in the
backward pass, right after its gradient is complete, and the gradient is freed at once.

Without it one GPU holds every gradient from the end of backward to the optimizer step (the
`gradients` term) and the step's temporaries for all of them; paged optimizer states are paged in
for the whole step. With it, at any moment of backward at most one parameter's gradient, its step's
temporaries and its paged states are alive beside the activations still to be used, so all three
shrink to those of the largest parameter (the embedding or output head of most LLMs) and count in
the train phase (they coincide with backward, not with a step after it). Optimizer states that are
not paged stay whole: each parameter's optimizer keeps its own.

Only one process that holds the whole model can do this (torchtune's `optimizer_in_bwd` on one
device): DDP reduces the gradients after the hooks would have used them, and ZeRO, FSDP and Megatron
own the optimizer step themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from recipeforge.capabilities import Refusal
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import GIB, Hardware

if TYPE_CHECKING:
    from recipeforge.plan.workload import Workload

KEY = "train.optimizer_in_backward"


class _HoldsWeights(Protocol):
    @property
    def trainer_holds_weights(self) -> bool: ...


class LayoutView(Protocol):
    """What the refusal reads of a `memory.Layout` (a Protocol: `memory` books this module's term, so
    naming its class here would make the two modules import each other)."""

    @property
    def offload(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def spec(self) -> _HoldsWeights: ...


def in_backward_refusals(w: Workload, layout: LayoutView) -> list[Refusal]:
    """Why `layout` (a `memory.Layout`) cannot run the optimizer step in the backward pass (empty when it can, or when the
    recipe does not ask for it)."""
    if not w.optimizer_in_backward:
        return []
    if layout.world_size == 1 and layout.spec.trainer_holds_weights and layout.offload == "none":
        return []
    return [Refusal(KEY, f"{layout.label} cannot run the optimizer step in the backward pass: it needs one "
                         "process holding the whole model and its gradients",
                    "set distributed.backend: single, or train.optimizer_in_backward: false")]


def in_backward_micro_batches(per_rank: int) -> list[int]:
    """The micro batches an `auto` micro batch may take with the step in backward: the whole per-rank
    batch (no accumulation), or 1 when the batch does not divide over the ranks (a batch problem)."""
    return [per_rank] if per_rank else [1]


def book_in_backward(w: Workload, part: dict[str, float], notes: list[str]) -> None:
    """Move the gradients, the step's temporaries and paged states of a full fine-tune with the
    optimizer step in backward into `in_backward_step`: those of the largest parameter only."""
    if not (w.optimizer_in_backward and w.full_finetune):
        return  # an adapter's gradients and states are small, and counted whole in `adapter`
    trainable = w.trainable_params()
    if not trainable:
        return
    share = min(1.0, w.model.largest_module_params() / trainable)
    whole = part["gradients"] + part["optimizer_step"] + part["paged_optimizer"]
    part["in_backward_step"] = whole * share
    part["gradients"] = part["optimizer_step"] = part["paged_optimizer"] = 0.0
    notes.append(f"optimizer step in the backward pass: one parameter's gradient, step temporaries and paged "
                 f"states at a time ({part['in_backward_step'] / GIB:.2f} GB, the largest parameter's), in place "
                 f"of {whole / GIB:.1f} GB for all of them")


def check_in_backward_hardware(optimizer_in_backward: bool, backend: str, hw: Hardware) -> None:
    """Refuse the step in backward where `auto` would spread the run over several GPUs: only one
    process can run it, so the recipe pins the one-GPU backend itself (and knows the rest stay idle)."""
    if optimizer_in_backward and backend == "auto" and hw.device == "cuda" and hw.num_gpus > 1:
        raise RecipeError(f"the optimizer step in the backward pass runs in one process, and {hw.describe()} has "
                          f"{hw.num_gpus} GPUs that distributed.backend: auto would train on together",
                          key=KEY, hint="set distributed.backend: single (one GPU trains), or "
                                        "train.optimizer_in_backward: false")
