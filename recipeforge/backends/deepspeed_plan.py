"""DeepSpeed's planning part: its ZeRO presets, the layouts it offers the planner, its memory terms
(`zero_states`, as DeepSpeed's own estimators count them) and its part of a plan (`ZeroPart`).

`deepspeed.DeepSpeedBackend` composes this with the running part (`deepspeed_run`); the planner reads
only what is here. Nothing here imports torch or DeepSpeed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from recipeforge.capabilities import Preset
from recipeforge.plan.backend_spec import Candidate, CpuSpread, PlannerSpec
from recipeforge.plan.estimators import deepspeed_zero3_mem_needs, zero_model_states
from recipeforge.plan.memory import BUFFER_FACTOR, Layout, assign_trainable, optimizer_state_bytes
from recipeforge.plan.types import BackendPart, Plan

if TYPE_CHECKING:
    from recipeforge.config.schema import DistributedConfig, Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.workload import Workload


def preset_name(zero_stage: int, offload: str) -> str:
    """The preset name of a ZeRO stage and offload (``zero3_offload``, ...)."""
    suffix = {"none": "", "optimizer": "_offload", "optimizer+params": "_offload_params"}[offload]
    return f"zero{zero_stage}{suffix}"


NAME = "deepspeed"


@dataclass(frozen=True)
class ZeroPart(BackendPart):
    """DeepSpeed's part of a plan: the ZeRO stage it runs."""

    zero_stage: int = 0

    def rows(self) -> list[tuple[str, str]]:
        return [("zero stage", str(self.zero_stage))]


def zero_part(plan: Plan) -> ZeroPart:
    """DeepSpeed's part of `plan` (the part a DeepSpeed plan carries: `plan_part_type`)."""
    part = plan.backend_part
    assert isinstance(part, ZeroPart), f"a {plan.backend} plan has no ZeRO stage"
    return part


PRESETS = tuple(Preset(preset_name(z, o), NAME, zero_stage=z, offload=o) for z, o in (
    (0, "none"), (1, "none"), (2, "none"), (3, "none"), (2, "optimizer"), (3, "optimizer"), (3, "optimizer+params")))

# (tier, within, ZeRO stage, offload, offered unpinned, why): the layouts DeepSpeed offers on GPUs
LAYOUTS = (
    (2, 1, 2, "none", True, "optimizer states sharded (ZeRO-2 also shards gradients); same traffic as DDP"),
    (2, 2, 1, "none", False, "optimizer states sharded; same traffic as DDP"),
    (2, 3, 0, "none", False, "DeepSpeed without partitioning"),
    (3, 1, 3, "none", True, "ZeRO-3: weights, gradients and optimizer states sharded; 1.5x DDP traffic"),
    (6, 0, 2, "optimizer", True, "ZeRO-Offload: optimizer states and step on the CPU, 16-bit weights on each GPU"),
    (6, 1, 3, "optimizer", True, "ZeRO-3 with the optimizer states and step on the CPU"),
    (7, 1, 3, "optimizer+params", True,
     "ZeRO-3 with optimizer states and parameters in CPU memory (ZeRO-Infinity style)"),
)


def cpu_settings(dist: DistributedConfig) -> tuple[int, str, str]:
    """(ZeRO stage, offload, preset) of DeepSpeed on the CPU: the recipe's preset or pins, else ZeRO-2
    (ZeRO-3 for a pinned parameter offload) without offload (memory is not what a CPU run is short of)."""
    if dist.preset:
        from recipeforge.plan.presets import get_preset

        p = get_preset(dist.preset, backend=NAME)
        assert p.zero_stage is not None  # every DeepSpeed preset names its stage (`PRESETS`)
        return p.zero_stage, p.offload, p.name
    offload = dist.offload if dist.offload != "auto" else "none"
    zero = dist.zero_stage if dist.zero_stage != "auto" else (3 if offload == "optimizer+params" else 2)
    return zero, offload, preset_name(zero, offload)


class ZeroPlanner(PlannerSpec):
    """What the planner asks of DeepSpeed: layouts, memory terms, traits and the plan part."""

    presets = PRESETS
    plan_part_type = ZeroPart
    cpu_preference = 2  # on the CPU only for what DDP cannot do (a pinned offload)
    trainer_holds_weights = False
    torch_allocates_gradients = False
    checkpoints_master_weights = True  # fp32 master weights travel with DeepSpeed's optimizer state

    # -- planning ---------------------------------------------------------------------------------
    def candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig | None, *,
                   pinned: bool) -> list[Candidate]:
        g = hw.num_gpus
        out = []
        for tier, within, zero, offload, unpinned, why in LAYOUTS:
            if offload == "none" and g <= 1 and not pinned:
                continue  # one GPU: nothing to shard over until memory runs out
            if not (unpinned or pinned):
                continue
            out.append(Candidate(Layout(NAME, preset_name(zero, offload), data_parallel=g, zero_stage=zero,
                                        offload=offload, nodes=hw.nodes, gpus_per_node=hw.gpus_per_node),
                                 tier, why, within))
        return out

    def cpu_candidate(self, dist: DistributedConfig) -> Candidate:
        zero, offload, preset = cpu_settings(dist)
        return Candidate(Layout(NAME, preset, zero_stage=zero, offload=offload, nodes=1, gpus_per_node=0),
                         1, f"DeepSpeed ZeRO-{zero} on the CPU (gloo), one process planned")

    def cpu_spread(self, dist: DistributedConfig) -> CpuSpread:
        zero, offload, preset = cpu_settings(dist)
        return CpuSpread(preset=preset, zero_stage=zero, offload=offload, part=ZeroPart(zero))

    def shards_weights(self, layout: Layout) -> bool:
        return layout.zero_stage == 3

    def plan_shards_weights(self, plan: Plan) -> bool:
        return zero_part(plan).zero_stage == 3

    def streams_final_save(self, w: Workload, layout: Layout) -> bool:
        # `outputs.streamed_save`: each partitioned parameter gathered alone; a checkpoint layout that
        # combines tensors (fused MoE experts written back one per expert) takes the gathered state dict
        return layout.zero_stage == 3 and not w.model.is_moe

    def recipe_refusals(self, recipe: Recipe) -> list[tuple[str, str]]:
        # torchao's float8 linear layers compose with FSDP2 and DDP; ZeRO partitions and casts the
        # weights itself, so `auto` never plans fp8 training on DeepSpeed.
        if recipe.train.precision == "fp8":
            return [("train.precision", "train.precision: fp8 training uses torchao's float8 linear layers, which "
                                        "compose with FSDP2 and DDP, not with DeepSpeed ZeRO (its engine "
                                        "partitions and casts the weights itself)")]
        return []

    def plan_part(self, layout: Layout) -> ZeroPart:
        assert layout.zero_stage is not None  # every DeepSpeed layout names its stage (`candidates`)
        return ZeroPart(layout.zero_stage)

    def model_states(self, w: Workload, layout: Layout, part: dict[str, float], trainable: float,
                     frozen_bytes: float) -> float:
        return zero_states(w, layout, part, trainable, frozen_bytes)

    def accuracy_band(self, w: Workload, layout: Layout) -> str:
        return "sharded" if layout.offload != "none" or layout.zero_stage == 3 else "calibrated"

    def precision(self, w: Workload) -> str:
        return f"{w.dtype} weights and gradients; fp32 master weights, gradients and optimizer states"


def zero_states(w: Workload, layout: Layout, part: dict[str, float], trainable: float, frozen_bytes: float) -> float:
    """DeepSpeed mixed precision as its estimators count it: 16-bit weights and gradients, and
    K = 16 bytes of fp32 state per parameter (master weights, gradients, momentum, variance).
    Stage 1 partitions K, stage 2 also the 16-bit gradients, stage 3 also the weights (its 16-bit
    gradients are reduced straight into the fp32 partition). Returns host bytes per node."""
    m, c, n = w.model, w.compute_bytes, layout.data_parallel
    stage = layout.zero_stage or 0
    fp32_extra = 8 if w.dtype != "fp32" else 0  # fp32 master weights + fp32 gradient partition
    k = fp32_extra + optimizer_state_bytes(w.optimizer, 4, m.hidden_size)
    offload_opt = layout.offload in ("optimizer", "optimizer+params")
    offload_params = layout.offload == "optimizer+params"
    grad_bytes = 0 if stage == 3 else c
    ww, gg, oo = zero_model_states(trainable, n, stage, weight_bytes=c, grad_bytes=grad_bytes, optimizer_bytes=k)
    frozen = frozen_bytes / n if stage == 3 else frozen_bytes
    h2 = m.hidden_size ** 2  # bucket sizes of the generated config (`artifacts.deepspeed_config`)
    if stage == 3:
        part["gathered_params"] += 4 * m.largest_module_params() + c * int(0.9 * h2)  # largest layer + prefetch
        part["comm_buffers"] = 2 * c * h2          # reduce bucket, double-buffered
    else:
        part["comm_buffers"] = 3 * c * h2          # reduce bucket (double-buffered) + all-gather bucket
    if offload_opt:
        oo, gg = 0.0, 0.0  # gradients stream into the fp32 partition in host memory
    if offload_params:
        ww, frozen = 0.0, 0.0
    assign_trainable(w, part, ww, gg, oo, frozen)
    if not offload_opt:
        return 0.0
    # Processes per node: one per GPU, or the CPU processes of a run over gloo (a CPU layout has none).
    per_node = layout.gpus_per_node or max(1, layout.data_parallel // max(1, layout.nodes))
    cpu: float
    if stage == 3:
        cpu, _, _ = deepspeed_zero3_mem_needs(trainable, m.largest_module_params(), per_node,
                                              layout.nodes, True, offload_params, True, BUFFER_FACTOR)
    else:
        # DeepSpeed's ZeRO-2 estimate: 16 bytes of offloaded fp32 state per parameter, or the fp32
        # copies the ranks build at start-up if larger; the states divided over the nodes as its
        # ZeRO-3 estimate does, the start-up copies counted for this node's ranks.
        cpu = trainable * max(4 * per_node, 16 / layout.nodes) * BUFFER_FACTOR
    if offload_params:
        cpu += frozen_bytes / layout.nodes * BUFFER_FACTOR
    return float(cpu)
