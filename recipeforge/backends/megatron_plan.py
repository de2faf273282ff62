"""The Megatron layouts the planner weighs: the tensor x pipeline splits of a target and the model states
of Megatron-Core's distributed optimizer on one rank."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from recipeforge.plan.estimators import zero_model_states
from recipeforge.plan.memory import assign_trainable, optimizer_state_bytes

if TYPE_CHECKING:
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.workload import Workload


def parallel_sizes(w: Workload, hw: Hardware, every_split: bool = False) -> list[tuple[int, int]]:
    """(TP, PP) pairs, smallest model-parallel size first. For automatic planning each size uses the
    largest tensor-parallel degree that stays inside a node and divides the attention heads, the rest
    becomes pipeline stages (Narayanan et al. 2021: TP within a node, PP across nodes); a pinned
    split may be any valid pair (`every_split`)."""
    m, g = w.model, hw.num_gpus
    valid_tp = [tp for tp in (1, 2, 4, 8) if tp <= hw.gpus_per_node and not m.num_heads % tp
                and not m.num_kv_heads % tp]
    sizes = []
    for mp in range(1, g + 1):
        if g % mp:
            continue
        tps = [t for t in valid_tp if mp % t == 0]
        for tp in sorted(tps, reverse=True)[: None if every_split else 1]:
            if mp // tp <= m.num_layers:
                sizes.append((tp, mp // tp))
    return sizes


def megatron_states(w: Workload, layout: Layout, part: dict[str, float], trainable: float, frozen_bytes: float) -> float:
    """Megatron-Core: 16-bit weights, fp32 main gradients, and fp32 master weights + Adam states
    sharded over data-parallel ranks by the distributed optimizer (6 + 12/d bytes per parameter),
    on the most loaded pipeline stage's share of the tensor-parallel split."""
    m, c = w.model, w.compute_bytes
    tp, pp, dp = layout.tensor_parallel, layout.pipeline_parallel, layout.data_parallel
    layers = math.ceil(m.num_layers / pp)
    if pp == 1:
        local_params = m.total_params()
    else:  # the first stage holds the embedding, the last the output layer (a copy when tied)
        local_params = layers * m.layer_params() + max(m.embedding_params(), m.vocab_size * m.hidden_size)
    local = local_params / tp
    share = local / m.total_params()
    local_trainable = trainable * share
    k = (4 if w.dtype != "fp32" else 0) + optimizer_state_bytes(w.optimizer, 4, m.hidden_size)
    ww, gg, oo = zero_model_states(local_trainable, dp, 1, weight_bytes=c, grad_bytes=4, optimizer_bytes=k)
    frozen = frozen_bytes * share
    cpu = 0.0
    if layout.offload != "none":
        # HybridDeviceOptimizer with offload_fraction 1.0: fp32 master weights, Adam states and a
        # copy of the gradients on the host for every rank of the node
        cpu = (oo + local_trainable * 4 / dp) * layout.gpus_per_node
        oo = 0.0
    assign_trainable(w, part, ww, gg, oo, frozen)
    return cpu
