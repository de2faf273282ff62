"""FSDP2 through Accelerate's FSDP plugin: full / hybrid sharding, auto-wrap by decoder layer,
activation checkpointing, CPU offload; sharded checkpoints, consolidated final/. With tensor or
context parallel in the plan, the mesh is accelerate's ParallelismConfig (`backends.parallelism`).

The backend is composed of two parts, one job each:

* `fsdp_plan` (with the memory terms of `fsdp_memory`): presets, the layouts it offers the planner,
  its memory terms and its part of the plan (`FSDPPart`);
* `fsdp_run`: the accelerate config and Trainer arguments, each worker's set-up (the CPU's FSDP2 path
  over gloo is described there), the final save and the report of what ran.
"""

from __future__ import annotations

from recipeforge.backends.fsdp_plan import NAME, PRESETS, FSDPPart, FSDPPlanner, fsdp_part, preset_name
from recipeforge.backends.fsdp_run import FSDPRuntime
from recipeforge.capabilities import BackendCapabilities

__all__ = ["NAME", "PRESETS", "FSDPBackend", "FSDPPart", "fsdp_part", "preset_name"]


class FSDPBackend(FSDPPlanner, FSDPRuntime):
    """Fully sharded data parallel (FSDP2, ``fully_shard``) via Accelerate."""

    name = NAME
    capabilities = BackendCapabilities(
        NAME, "FSDP2 (fully_shard) through Accelerate; NCCL on GPUs, gloo on the CPU",
        quantization_bits=(4,), offload=("none", "optimizer+params"),
        parallel_sizes=("tensor_parallel", "context_parallel", "data_parallel_replicate", "data_parallel_shard",
                        "expert_parallel"),
        cpu_parallel_sizes=("tensor_parallel", "expert_parallel"), cpu_offload=("none",),
        presets=tuple(p.name for p in PRESETS),
        why={"cpu_offload": "FSDP2 offload moves weights between an accelerator and host memory; on the CPU "
                            "they are in host memory already (the CPUOffloadPolicy of torch needs an accelerator)",
             "cpu_parallel": "on the CPU every process shards the model (tensor or expert parallel inside); context "
                             "parallel (ring attention) needs CUDA, and replica/shard mesh sizes are for GPU nodes",
             "quant_bits": "FSDP shards 4-bit weights stored as bf16/fp16 words (bnb_4bit_quant_storage); "
                           "8-bit weights are int8 with per-row scales and do not shard",
             "offload": "FSDP2's CPU offload moves parameters, gradients and optimizer states together"})
