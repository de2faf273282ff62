"""`distributed:` and `hardware:` — how to spread the run, and the machine it is planned for."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field

from recipeforge.config.schema.base import Section

Backend = Literal["auto", "single", "ddp", "deepspeed", "fsdp", "megatron"]


class DistributedConfig(Section):
    """The distributed backend; `auto` lets the planner choose and explain why."""

    backend: Backend = Field("auto", description="single | ddp | deepspeed | fsdp | megatron, or `auto` (planner).")
    preset: Optional[str] = Field(
        None, description="A named backend preset (zero2, zero3_offload, fsdp_full_shard, ...); see `recipeforge plan`.")
    zero_stage: Union[Literal["auto"], Literal[0, 1, 2, 3]] = Field(
        "auto", description="DeepSpeed ZeRO stage; `auto` lets the planner choose.")
    offload: Literal["auto", "none", "optimizer", "optimizer+params"] = Field(
        "auto", description="Offload optimizer states (and parameters) to CPU memory; `auto`: only when nothing "
                            "fits on the GPUs alone; `none` forbids it.")
    tensor_parallel: int = Field(1, ge=1, description="Tensor-parallel size (Megatron).")
    pipeline_parallel: int = Field(1, ge=1, description="Pipeline-parallel size (Megatron).")
    fsdp_sharding: Literal["full_shard", "hybrid_shard", "shard_grad_op"] = Field(
        "full_shard", description="FSDP sharding strategy.")
    memory_headroom: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory the planner may fill.")
    timeout_minutes: float = Field(
        60.0, gt=0,
        description="How long a process waits for the others at a collective (a barrier, a gradient "
                    "all-reduce) before the job stops with a timeout: torch's `init_process_group(timeout=)` "
                    "and the trainer's `ddp_timeout` (Axolotl's `ddp_timeout`, here in minutes). 60 leaves room "
                    "for the main process saving or merging a large model while the others wait, and still "
                    "ends a hung job within the hour (NCCL's own default is 10).")


class HardwareConfig(Section):
    """The machine(s) to plan for when not planning for the local one."""

    nodes: int = Field(1, ge=1, description="Number of machines.")
    gpus_per_node: int = Field(1, ge=0, description="GPUs per machine (0: CPU only).")
    gpu: Optional[str] = Field(None, description="Accelerator name, e.g. H100-80GB, A100-40GB, L4-24GB.")
    cpu_ram_gb: Optional[float] = Field(
        None, gt=0, description="Host memory per machine in GB, for offload planning (default: probed locally, "
                                "else assumed).")
