"""Activations under `train.activation_offloading` (TRL's `OffloadActivations`): what stays on the GPU
and what moves to pinned host memory.

TRL's saved-tensor hooks copy every tensor autograd saves in the forward pass (1 KiB or more, not a
parameter) to pinned host memory on a side stream, keeping the last `FORWARD_STASH` of them alive on
the GPU until their copy has finished; the output head runs without offloading (its input stays,
and the logits and the loss are computed as usual). Backward brings one layer's tensors back at a
time while the next layer's are prefetched. So the GPU keeps:

- the stash of the forward pass: at most `FORWARD_STASH` saved tensors, each at most the widest one
  a layer saves (the MLP's intermediate, or with recomputation the layer input);
- in backward, two layers' worth: without recomputation two layers' saved tensors, with it the
  layer being recomputed in full plus two layer inputs;
- the tensors outside the layers (final norm, the output head's input), as without offloading.

The rest of `activation_bytes` lives in host RAM, pinned (page-locked) on every GPU's process.
"""

from __future__ import annotations

from recipeforge.plan.activations import activation_bytes, layer_activation_parts
from recipeforge.plan.workload import Workload

FORWARD_STASH = 5  # trl.models.activation_offloading.get_act_offloading_ctx_manager(max_fwd_stash_size=5)


def offloaded_activations(w: Workload, tokens: int, *, layers: int, checkpointing: bool, tensor_parallel: int = 1,
                          context_parallel: int = 1, sequence_parallel: bool = True) -> tuple[float, float]:
    """(bytes on the GPU, bytes in pinned host memory) of one micro batch's activations with TRL's
    activation offloading, for the same arguments as `activation_bytes`."""
    m, c = w.model, w.compute_bytes
    t = tensor_parallel
    local = tokens / context_parallel
    kept = activation_bytes(w, tokens, layers=layers, checkpointing=checkpointing, tensor_parallel=t,
                            context_parallel=context_parallel, sequence_parallel=sequence_parallel)
    parts = layer_activation_parts(w)
    split, whole = parts["attention"] + parts["mlp"], parts["norms"] + parts["lora"]
    per_layer = (split + whole) / t if sequence_parallel else split / t + whole
    layer_input = c * m.hidden_size / (t if sequence_parallel else 1)
    outside = (4 * m.hidden_size + 2 * c * m.hidden_size) / (t if sequence_parallel else 1)
    widest = layer_input if checkpointing else c * max(m.mlp_width / t, m.hidden_size)
    stash = FORWARD_STASH * widest
    backward = per_layer + 2 * layer_input if checkpointing else 2 * per_layer
    on_gpu = min(kept, local * (outside + max(stash, backward)))
    return on_gpu, kept - on_gpu


def offload_note(on_gpu: float, host: float, gib: float) -> str:
    """The plan's note on what activation offloading moved."""
    return (f"activation offloading: {host / gib:.1f} GB of activations per GPU in pinned host memory, "
            f"{on_gpu / gib:.1f} GB stay on the GPU (forward stash, the layer in backward, output head input)")
