"""Megatron's planning part: the layouts the planner weighs (the tensor x pipeline splits of a target),
the model states of Megatron-Core's distributed optimizer on one rank, its generated presets
(``tp{T}_pp{P}[_offload]``) and the recipe settings it cannot honour.

`megatron.MegatronBackend` composes this with the running part (`megatron_run`); the planner reads
only what is here. Nothing here imports Megatron."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from recipeforge.capabilities import Preset
from recipeforge.plan.backend_spec import Candidate, PlannerSpec
from recipeforge.plan.estimators import zero_model_states
from recipeforge.plan.memory import Layout, assign_trainable, optimizer_state_bytes
from recipeforge.plan.types import Choice
from recipeforge.stage_specs import Stage

if TYPE_CHECKING:
    from recipeforge.config.schema import DistributedConfig, Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.workload import Workload

NAME = "megatron"
# Presets are generated for each tensor x pipeline split: tp{T}_pp{P}[_offload].
PRESET_PATTERN = re.compile(r"^tp(\d+)_pp(\d+)(_offload)?$")


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


class MegatronPlanner(PlannerSpec):
    """What the planner asks of Megatron: layouts, memory terms, traits, reasons and refusals."""

    trainer_holds_weights = False
    torch_allocates_gradients = False
    sequence_parallel = True
    preset_names_sizes = True
    # Megatron-Bridge trains packed rows one per micro batch (`components.megatron_data`); a pinned
    # micro batch other than 1 is refused with the recipe (`config.schema.megatron_fields`).
    fixed_micro_batch = 1

    def preset(self, name: str) -> Preset | None:
        match = PRESET_PATTERN.match(name)
        if match is None:
            return None
        return Preset(name, NAME, tensor_parallel=int(match.group(1)), pipeline_parallel=int(match.group(2)),
                      offload="optimizer" if match.group(3) else "none")

    def preset_names(self) -> list[str]:
        return ["tp{T}_pp{P}[_offload]"]

    def candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig | None, *,
                   pinned: bool) -> list[Candidate]:
        g = hw.num_gpus
        # automatically for pretraining dense models with every weight trained on several GPUs; any run when
        # pinned, one GPU included (TP = PP = 1: Megatron-Bridge's loop and checkpoints on a single device)
        if g < 1 or (g == 1 and not pinned) or not (pinned or (w.stage == Stage.PRETRAIN and not w.model.is_moe
                                                                and w.full_finetune)):
            return []
        out = []
        for offload in ("none", "optimizer"):
            for tp, pp in parallel_sizes(w, hw, every_split=pinned):
                suffix = "_offload" if offload != "none" else ""
                why = (f"tensor parallel {tp} inside a node, pipeline parallel {pp}"
                       + ("; optimizer on the CPU" if offload != "none" else ""))
                layout = Layout(NAME, f"tp{tp}_pp{pp}{suffix}", data_parallel=g // (tp * pp), tensor_parallel=tp,
                                pipeline_parallel=pp, offload=offload, nodes=hw.nodes,
                                gpus_per_node=hw.gpus_per_node)
                out.append(Candidate(layout, 4 if offload == "none" else 5, why))
        return out

    def model_states(self, w: Workload, layout: Layout, part: dict[str, float], trainable: float,
                     frozen_bytes: float) -> float:
        return megatron_states(w, layout, part, trainable, frozen_bytes)

    def accuracy_band(self, w: Workload, layout: Layout) -> str:
        return "uncalibrated"

    def precision(self, w: Workload) -> str:
        return f"{w.dtype} weights and gradients; fp32 master weights, gradients and optimizer states"

    def plan_reasons(self, layout: Layout, dist: DistributedConfig, w: Workload) -> dict[str, Choice]:
        pinned_sizes = dist.pinned_size("tensor_parallel") is not None or dist.pipeline_parallel > 1
        return {"tensor_parallel": Choice(layout.tensor_parallel, "recipe pins it" if pinned_sizes else
                                          "largest split inside a node (dividing the heads) before adding "
                                          "pipeline stages"),
                "pipeline_parallel": Choice(layout.pipeline_parallel, f"{w.model.num_layers} layers over "
                                            f"{layout.pipeline_parallel} stage(s)")}

    def recipe_refusals(self, recipe: Recipe) -> list[tuple[str, str]]:
        # Megatron maps recipe fields one by one; a setting it cannot honour rules it out, so `auto`
        # never plans a layout that validation or `check()` would refuse.
        from recipeforge.config.schema.megatron_fields import megatron_problems

        return list(megatron_problems(recipe))
