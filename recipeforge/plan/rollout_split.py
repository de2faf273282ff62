"""The rollout side of an on-policy RL plan (GRPO, RLOO): the generation engine's memory, and the split of the
target's GPUs between training and generation a server-mode run would use.

Colocated, the engine shares every training GPU: vLLM holds `rollout.gpu_memory_utilization` of each GPU
for its bf16 weights and the KV cache (what is left of the share); `hf` generates with the policy itself,
its KV cache counted in the training memory. The split for server mode: the generation server needs a
tensor-parallel size whose weight shard leaves at least half of a GPU to the KV cache; the trainers get the
remaining GPUs, as many as divide the global batch evenly (each trainer takes an equal part of a step's
completions); the GPUs left over serve as more generation replicas. The training memory on fewer GPUs is
the colocated estimate without the engine's share, its sharded states scaled to the smaller group.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from recipeforge.plan.hardware import GIB, Hardware
from recipeforge.plan.types import Choice

if TYPE_CHECKING:
    from recipeforge.plan.policy import Evaluation
    from recipeforge.plan.workload import Workload

SERVED_BYTES = 2          # the engine serves the policy in bf16
KV_SHARE_MIN = 0.5        # a generation GPU keeps at least half of its memory for the KV cache
SHARDED = ("weights", "gradients", "optimizer_states")


def rollout_reasons(w: Workload, hw: Hardware, ev: Evaluation, limit_gb: float, *, group: int = 1
                    ) -> dict[str, Choice]:
    """The plan's `rollout_memory` and `rollout_split` decisions (none off GPUs or for stages that don't generate);
    `group` is the section's num_generations (a global batch a split proposes stays a multiple of it)."""
    r = w.rollout
    if r is None or r.per_micro_batch or hw.device != "cuda":
        return {}
    from recipeforge.plan.activations import kv_cache_bytes

    gpu = hw.gpu_memory_gb
    weights = w.model.total_params() * SERVED_BYTES / GIB
    per_seq = kv_cache_bytes(w, 1) / GIB * SERVED_BYTES / w.compute_bytes
    layout = ev.layout
    sequences = ev.micro_batch * ev.accumulation  # completions one training process generates per step
    out: dict[str, Choice] = {}
    if r.colocated and r.reserves_memory:
        share = r.gpu_memory_utilization * gpu
        kv = share - weights / max(1, layout.tensor_parallel)
        fits = max(0, math.floor(kv / per_seq)) if kv > 0 else 0
        why = (f"colocated {r.engine}: {r.gpu_memory_utilization:.0%} of each {gpu:.1f} GB GPU = {share:.1f} GB: "
               f"weights {weights:.1f} GB (bf16) + KV cache {max(kv, 0.0):.1f} GB, room for {fits} sequences of "
               f"{r.prompt_len}+{r.completion_len} tokens; a step generates {sequences} per GPU")
        if kv <= 0:
            why += "; the weights do not fit in the share: raise rollout.gpu_memory_utilization or use server mode"
        out["rollout_memory"] = Choice(round(share, 2), why)
    elif not r.colocated:
        out["rollout_memory"] = Choice(0.0, f"server mode: {r.engine} runs on GPUs of its own (weights "
                                            f"{weights:.1f} GB in bf16 plus its KV cache), none on the trainers'")
    else:
        out["rollout_memory"] = Choice(0.0, f"{r.engine}: the policy generates itself; its KV cache "
                                            f"({per_seq * sequences:.1f} GB for {sequences} sequences) is part of "
                                            "the training memory above")
    split = _split(w, hw, ev, weights, per_seq, limit_gb, group)
    if split is not None:
        out["rollout_split"] = split
    return out


def _split(w: Workload, hw: Hardware, ev: Evaluation, weights: float, per_seq: float,
           limit_gb: float, group: int) -> Choice | None:
    gpus, gpu = hw.num_gpus, hw.gpu_memory_gb
    if gpus < 2:
        return Choice("-", "one GPU: training and generation share it (colocated)")
    tp = 1
    while weights / tp > (1 - KV_SHARE_MIN) * gpu * 0.9 and tp < gpus:
        tp *= 2
    if tp >= gpus:
        return Choice("-", f"the engine needs tensor parallel {tp} for {weights:.1f} GB of weights: no GPU is left "
                           "to train; colocate instead")
    global_batch = ev.micro_batch * ev.accumulation * ev.layout.data_parallel
    most = gpus - tp
    trainers = next(t for t in range(most, 0, -1) if global_batch % t == 0)
    generators = gpus - trainers
    replicas = generators // tp
    memory = _training_memory(ev, trainers)
    parts = [f"{generators} GPU(s) generate ({replicas} {'replica' if replicas == 1 else 'replicas'} at tensor "
             f"parallel {tp}: weights {weights / tp:.1f} GB per GPU, the rest KV cache, "
             f"~{math.floor((0.9 * gpu - weights / tp) / per_seq)} sequences each)",
             f"{trainers} train (global batch {global_batch} / {trainers} = {global_batch // trainers} completions "
             f"each; training memory ~{memory:.1f} GB per GPU of {limit_gb:.1f})"]
    if trainers < most:
        step = math.lcm(most, group)
        nearest = sorted({global_batch - global_batch % step, global_batch - global_batch % step + step} - {0})
        parts.append(f"{most} trainers would need a global batch divisible by {step} ({most} trainers, groups of "
                     f"{group}): "
                     f"train.global_batch_size {' or '.join(map(str, nearest))}")
    if memory > limit_gb:
        parts.append("the trainers would not fit: keep the engine colocated")
    return Choice(f"{trainers} train + {generators} generate", "proposed for rollout.mode: server; " + "; ".join(parts))


def _training_memory(ev: Evaluation, trainers: int) -> float:
    """The colocated peak without the engine's share, sharded states spread over `trainers` GPUs."""
    comp = ev.memory.components
    total = ev.memory.total - comp.get("rollout_engine", 0.0)
    # Tier 2 and up of the preference order shard gradients and optimizer states; weights too where the
    # backend says so (`PlannerSpec.shards_weights`).
    if ev.candidate.tier >= 2 and trainers < ev.layout.data_parallel:
        names = SHARDED if ev.layout.spec.shards_weights(ev.layout) else SHARDED[1:]
        sharded = sum(comp.get(k, 0.0) for k in names)
        total += sharded * (ev.layout.data_parallel / trainers - 1)
    return total / GIB
