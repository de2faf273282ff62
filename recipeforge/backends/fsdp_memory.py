"""FSDP2's memory terms for the planner: the sharded model states on one GPU (`fsdp_states`) and what
FSDP2 holds unsharded at each moment of a step (`fsdp_gathered`). Pure arithmetic on a workload and
a layout; `fsdp_plan.FSDPPlanner` hands them to the planner."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.plan.estimators import zero_model_states
from recipeforge.plan.memory import assign_trainable, foreach_temp, optimizer_state_bytes, quantized_bytes_per_param
from recipeforge.plan.train_phase import Gathered

if TYPE_CHECKING:
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.workload import Workload


def fsdp_states(w: Workload, layout: Layout, part: dict[str, float], trainable: float, frozen_bytes: float) -> float:
    """FSDP2 through Accelerate: trainable parameters are upcast to fp32 and sharded with their
    gradients and optimizer states; compute runs on 16-bit unsharded copies gathered per layer."""
    m, c = w.model, w.compute_bytes
    # FSDP2 shards over the dp_shard x cp mesh (accelerate's `dp_shard_cp`); tensor parallelism splits
    # every sharded weight first (its DTensor shards), so states and gathered layers divide by t too.
    tp, cp = layout.tensor_parallel, layout.context_parallel
    shard = layout.data_parallel // max(1, layout.dp_replicate)
    if layout.fsdp_sharding == "hybrid_shard" and layout.dp_replicate == 1:
        shard = layout.gpus_per_node // (tp * cp)
    n = shard * cp
    ww, gg, oo = zero_model_states(trainable / tp, n, 3, weight_bytes=4, grad_bytes=4,
                                   optimizer_bytes=optimizer_state_bytes(w.optimizer, 4, m.hidden_size))
    frozen = frozen_bytes / (n * tp)
    base_per_param = (frozen_bytes / m.total_params()) if not w.full_finetune else c
    if foreach_temp(w.optimizer) and layout.offload == "none":
        part["optimizer_step"] = oo / 2
    if layout.offload != "none":
        # CPUOffloadPolicy: sharded parameters, gradients and optimizer states live in host memory,
        # plus the 16-bit checkpoint the main process loads before sharding (cpu_ram_efficient_loading)
        cpu = (ww + gg + oo + frozen) * layout.gpus_per_node + m.total_params() * base_per_param / tp
        assign_trainable(w, part, 0.0, 0.0, 0.0, 0.0)
        return cpu
    assign_trainable(w, part, ww, gg, oo, frozen)
    return 0.0


def fsdp_gathered(w: Workload, layout: Layout) -> Gathered:
    """What FSDP2 holds unsharded at each moment of the step (bytes per GPU), as torch's FSDP2 moves it
    (`FSDPMemTracker` on a fake process group shows each; bench/plan_vs_tracker.py).

    The root (embeddings, output layer, final norm) is not resharded after forward, as backward needs
    it at once. A layer's all-gather output is kept until the next layer's all-gather has been copied
    out (the root's too: in the first layer's forward both are alive), and backward prefetches the
    next layer's while the current one is gathered. A layer's gradients come out unsharded; its
    reduce-scatter copies them into an input buffer that is kept until the next layer's
    reduce-scatter starts, so every layer after the first of backward meets the previous one's
    buffer. The root's gradients (the output
    layer's from its backward on, the embeddings' at the end) wait for the root's reduce-scatter
    after the whole backward. `shard_grad_op` (reshard_after_forward=False) keeps every layer
    unsharded from its forward to its backward. Tensor parallelism splits all of it."""
    from recipeforge.plan.fp8 import gathered_layer_saving

    root, layer, grads = _fsdp_unsharded(w)
    layer -= gathered_layer_saving(w, layout.tensor_parallel)  # train.precision fp8: converted weights gathered in float8
    m, c = w.model, w.compute_bytes
    head_grad = c * m.output_width * m.hidden_size if w.full_finetune else 0.0
    embed_grad = c * m.embedding_params() if w.full_finetune and m.head_params() else 0.0  # tied: the head's
    if layout.fsdp_sharding == "shard_grad_op":
        every = root + m.num_layers * layer
        out = Gathered(forward=every + layer, forward_end=every, backward=every, layer=every,
                       layer_later=every + grads, layer_gradients=grads, root_end=every + embed_grad + grads,
                       output_gradient=head_grad)
    else:
        # backward prefetches the next layer while there is one: the last layer's backward has it from
        # two layers on, a later layer's (with the previous reduce-scatter input) from three
        prefetch_first, prefetch_later = (layer if m.num_layers > n else 0.0 for n in (1, 2))
        out = Gathered(forward=root + max(root, layer) + 2 * layer, forward_end=root + layer, backward=root + layer,
                       layer=root + layer + prefetch_first, layer_later=root + layer + prefetch_later + grads,
                       layer_gradients=grads, root_end=root + embed_grad + grads, output_gradient=head_grad)
    return out.divided(layout.tensor_parallel)


def _fsdp_unsharded(w: Workload) -> tuple[float, float, float]:
    """Bytes of FSDP2's root gathered, one decoder layer gathered, and one layer's unsharded
    gradients. Gathered copies keep each part's own dtype: QLoRA's embeddings, output layer and norms
    are not quantized (and stay in the compute dtype, the 4-bit weights' storage dtype), its decoder
    linears are. Gradients come out in the compute dtype (Accelerate sets reduce dtype = param dtype)."""
    m, c = w.model, w.compute_bytes
    root = (m.embedding_params() + m.head_params() + m.final_norm_params()) * c
    if w.adapter == "qlora":
        linear = m.quantized_params() / m.num_layers
        layer = (linear * quantized_bytes_per_param(w.quant_bits, w.double_quant, m.hidden_size)
                 + (m.layer_params() - linear) * c)
    else:
        layer = m.layer_params() * c
    trainable_layer = m.layer_params() if w.full_finetune else w.trainable_params() / max(1, m.num_layers)
    return root, layer, c * trainable_layer
