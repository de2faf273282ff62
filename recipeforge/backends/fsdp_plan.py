"""FSDP2's planning part: its presets, the layouts it offers the planner, its memory terms
(`fsdp_memory`) and its part of a plan (`FSDPPart`: the sharding and the device mesh).

`fsdp.FSDPBackend` composes this with the running part (`fsdp_run`); the planner reads only what is
here. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from recipeforge.backends.fsdp_memory import fsdp_gathered, fsdp_states
from recipeforge.capabilities import Preset
from recipeforge.plan.backend_spec import Candidate, CpuSpread, PlannerSpec
from recipeforge.plan.memory import Layout
from recipeforge.plan.types import BackendPart, Plan

if TYPE_CHECKING:
    from recipeforge.config.schema import DistributedConfig
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.train_phase import Gathered
    from recipeforge.plan.workload import Workload

NAME = "fsdp"


@dataclass(frozen=True)
class FSDPPart(BackendPart):
    """FSDP2's part of a plan: the sharding it runs and its device mesh (Accelerate's ParallelismConfig:
    replicas x GPUs each replica shards over; tensor and context sizes are the plan's own)."""

    sharding: str = "full_shard"   # full_shard | shard_grad_op | hybrid_shard
    dp_replicate: int = 1          # replicas (hybrid sharding): ParallelismConfig.dp_replicate_size
    dp_shard: int = 1              # GPUs a replica shards over: ParallelismConfig.dp_shard_size

    def rows(self) -> list[tuple[str, str]]:
        mesh = f", {self.dp_replicate} replicas x {self.dp_shard}" if self.dp_replicate > 1 else ""
        return [("fsdp sharding", f"{self.sharding}{mesh}")]


def fsdp_part(plan: Plan) -> FSDPPart:
    """FSDP2's part of `plan` (the part an FSDP plan carries: `plan_part_type`)."""
    part = plan.backend_part
    assert isinstance(part, FSDPPart), f"a {plan.backend} plan has no FSDP sharding"
    return part


def preset_name(sharding: str, offload: str) -> str:
    """The preset name of an FSDP sharding strategy and offload."""
    return f"fsdp_{sharding}" + ("_offload" if offload != "none" else "")


PRESETS = tuple(Preset(preset_name(sh, o), NAME, sharding=sh, offload=o) for sh, o in (
    ("shard_grad_op", "none"), ("full_shard", "none"), ("hybrid_shard", "none"), ("full_shard", "optimizer+params")))


def cpu_settings(dist: DistributedConfig) -> tuple[str, str, str]:
    """(sharding, offload, preset) of FSDP2 on the CPU: the recipe's preset or pins, else full sharding
    without offload. One machine has no replicas to shard within, so hybrid sharding is full sharding."""
    if dist.preset:
        from recipeforge.plan.presets import get_preset

        p = get_preset(dist.preset, backend=NAME)
        assert p.sharding is not None  # every FSDP preset names its sharding (`PRESETS`)
        sharding, offload = p.sharding, p.offload
    else:
        sharding, offload = dist.fsdp_sharding, dist.offload if dist.offload != "auto" else "none"
    sharding = "full_shard" if sharding == "hybrid_shard" else sharding
    return sharding, offload, preset_name(sharding, offload)


class FSDPPlanner(PlannerSpec):
    """What the planner asks of FSDP2: layouts, memory terms, traits and the plan part."""

    presets = PRESETS
    plan_part_type = FSDPPart
    trainer_holds_weights = False

    # -- planning ---------------------------------------------------------------------------------
    def candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig | None, *,
                   pinned: bool) -> list[Candidate]:
        g = hw.num_gpus
        out = []

        def add(tier: int, within: float, why: str, sharding: str, offload: str = "none", **kw: int) -> None:
            layout = Layout(NAME, preset_name(sharding, offload), data_parallel=g, fsdp_sharding=sharding,
                            offload=offload, nodes=hw.nodes, gpus_per_node=hw.gpus_per_node, **kw)
            out.append(Candidate(layout, tier, why, within))

        if g > 1 or pinned:
            add(2, 0, "optimizer states and gradients sharded; weights gathered once per step", "shard_grad_op")
            add(3, 0, "weights, gradients and optimizer states sharded; weights gathered per layer "
                      "(1.5x DDP traffic)", "full_shard")
            if hw.nodes > 1 and pinned:
                add(3, 0.5, "sharded within each node, replicated across nodes", "hybrid_shard",
                    dp_replicate=hw.nodes)
        if g > 1 and dist is not None:
            out += self._parallel_candidates(w, hw, dist)
        add(7, 0, "FSDP2 with parameters, gradients and optimizer states in CPU memory", "full_shard",
            offload="optimizer+params")
        return out

    def _parallel_candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig) -> list[Candidate]:
        """FSDP2 with tensor and/or context parallel (`plan.parallel_layouts.splits`), after the layouts
        that shard only data: planned when a model's layers or a sequence's activations need them."""
        from recipeforge.plan.parallel_layouts import splits

        found, _ = splits(w.model, hw, dist, seq_len=w.seq_len, stage=w.stage, adapter=w.adapter,
                          attention=w.attn_implementation, packing=w.packing)
        out = []
        for s in found:
            parts = []
            if s.tensor_parallel > 1:
                parts.append(f"tensor parallel {s.tensor_parallel} (the model's tensor-parallel plan) splits the "
                             "heads, MLP columns and their activations")
            if s.context_parallel > 1:
                parts.append(f"context parallel {s.context_parallel} (ring attention) splits each sequence and "
                             "its activations")
            why = "; ".join(parts) + f"; FSDP2 shards over {s.dp_shard}" + (
                f" x {s.dp_replicate} replicas" if s.dp_replicate > 1 else "")
            sharding = "hybrid_shard" if s.dp_replicate > 1 else "full_shard"
            out.append(Candidate(Layout(NAME, preset_name(sharding, "none"), data_parallel=s.data_parallel,
                                        tensor_parallel=s.tensor_parallel, context_parallel=s.context_parallel,
                                        dp_replicate=s.dp_replicate, fsdp_sharding=sharding,
                                        nodes=hw.nodes, gpus_per_node=hw.gpus_per_node), 4, why, 1))
        return out

    def cpu_candidate(self, dist: DistributedConfig) -> Candidate:
        sharding, offload, preset = cpu_settings(dist)
        return Candidate(Layout(NAME, preset, offload=offload, fsdp_sharding=sharding, nodes=1, gpus_per_node=0),
                         1, f"FSDP2 ({sharding}) on the CPU (gloo), one process planned")

    def cpu_spread(self, dist: DistributedConfig) -> CpuSpread:
        sharding, offload, preset = cpu_settings(dist)
        # tensor parallel: the recipe pins it; every tp ranks hold one model replica's shards
        tp = dist.pinned_size("tensor_parallel") or 1
        return CpuSpread(preset=preset, offload=offload, fsdp_sharding=sharding, tensor_parallel=tp,
                         part=FSDPPart(sharding))

    def matches_pins(self, layout: Layout, dist: DistributedConfig) -> bool:
        # pinned replicas shard inside each replica: hybrid sharding, whatever fsdp_sharding says
        replicas = (dist.pinned_size("data_parallel_replicate") or 1) > 1
        return layout.fsdp_sharding == dist.fsdp_sharding or (replicas and layout.dp_replicate > 1)

    def shards_weights(self, layout: Layout) -> bool:
        return True

    def plan_shards_weights(self, plan: Plan) -> bool:
        return True

    def rank0_loads_whole(self, w: Workload, layout: Layout) -> bool:
        # Accelerate's cpu_ram_efficient_loading: rank 0 loads the checkpoint and broadcasts each shard; a
        # QLoRA base is quantized as it loads, on every rank
        return w.adapter != "qlora"

    def streams_final_save(self, w: Workload, layout: Layout) -> bool:
        # `outputs.streamed_save`: each DTensor gathered alone; a checkpoint layout that combines
        # tensors (fused MoE experts written back one per expert) takes the gathered state dict
        return not w.model.is_moe

    def model_states(self, w: Workload, layout: Layout, part: dict[str, float], trainable: float,
                     frozen_bytes: float) -> float:
        return fsdp_states(w, layout, part, trainable, frozen_bytes)

    def gathered(self, w: Workload, layout: Layout, engine_gathered: float) -> Gathered:
        return fsdp_gathered(w, layout)

    def holds_layer_gradient(self, w: Workload) -> bool:
        return True

    def accuracy_band(self, w: Workload, layout: Layout) -> str:
        return "sharded"

    def precision(self, w: Workload) -> str:
        return f"fp32 sharded weights, gradients and optimizer states; {w.dtype} compute on gathered copies"

    def plan_part(self, layout: Layout) -> FSDPPart:
        # the sharding the chosen layout was sized with is the one this backend runs
        return FSDPPart(layout.fsdp_sharding, layout.dp_replicate, layout.data_parallel // max(1, layout.dp_replicate))
