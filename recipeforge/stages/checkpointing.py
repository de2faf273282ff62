"""Activation checkpointing beyond "every layer, everything recomputed": selective (per-op) and every
N-th layer, on transformers' own checkpointing of its decoder layers.

- ``selective``: each decoder layer is checkpointed with torch's selective activation checkpointing
  (`torch.utils.checkpoint.create_selective_checkpoint_contexts`), the policy torchtitan uses: the
  outputs of the matrix multiplies (every second one, counted in call order) and of attention are
  saved, everything else (norms, activations functions, elementwise ops) is recomputed in backward.
  Most of the compute of a layer is not redone, for a part of the memory that no checkpointing keeps.
- every N-th layer (`train.checkpoint_every: N`): layers 0, N, 2N, ... are checkpointed in full, the
  others keep their activations.

The Trainer enables plain full checkpointing itself (`stages.trainer_args`); these two modes are
enabled here on the model before the trainer is built, and the Trainer's own switch stays off.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from torch._ops import OpOverload
    from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext
    from transformers import PreTrainedModel

SELECTIVE = "selective"


def _saved_ops() -> set[OpOverload]:
    """The ops whose outputs selective checkpointing keeps (torchtitan's list, plus the CPU kernels of
    attention and the fused bias matmul that nn.Linear with a bias dispatches to)."""
    import torch

    aten = torch.ops.aten
    ops = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.max.default}
    for name in ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
                 "_scaled_mm"):
        op = getattr(aten, name, None)
        if op is not None:
            ops.add(op.default)
    return ops


MATMULS = ("mm", "addmm")


def selective_context() -> Any:
    """A fresh pair of checkpoint contexts for one layer call: saves the outputs of attention and of
    every second matrix multiply (counted separately in the forward and in the recomputation, so both
    make the same choices), recomputes the rest."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved = _saved_ops()
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: SelectiveCheckpointContext, func: OpOverload, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        key = "recompute" if ctx.is_recompute else "forward"
        matmul = func.__name__.split(".")[0] in MATMULS
        if matmul:
            counts[key] += 1
        keep = func in saved and not (matmul and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)  # type: ignore[no-untyped-call]  # unannotated in torch


def enable_checkpointing(model: PreTrainedModel | PeftModel, *, selective: bool, every: int = 1) -> int:
    """Checkpoint `model`'s decoder layers selectively, or every `every`-th layer in full; returns the
    number of layers checkpointed. `model` may be wrapped by peft."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if selective:
        kwargs["context_fn"] = selective_context
    if hasattr(base, "activation_checkpointing_enable"):  # transformers 5
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    layers = [m for m in base.modules() if _is_checkpointed_layer(m)]
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i % max(1, every) == 0
    return sum(1 for layer in layers if layer.gradient_checkpointing)


def _is_checkpointed_layer(module: torch.nn.Module) -> bool:
    """A transformers layer that checkpoints its forward when its flag is set."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return isinstance(module, GradientCheckpointingLayer)
