"""The data the planner produces. Later steps (launch, stage runners) read these fields only.

Field names here are a contract shared with the stage runners and backends: extend, do not rename.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Choice:
    """An automatic (or pinned) decision and why it was made."""

    value: Any
    reason: str


@dataclass(frozen=True)
class Plan:
    """How a recipe runs on given hardware."""

    backend: str                  # "single" | "ddp" | "deepspeed" | "fsdp" | "megatron"
    preset: str | None            # e.g. "zero3_offload", "fsdp_full_shard"; None for single/ddp
    device: str                   # "cuda" | "cpu"
    nodes: int
    gpus_per_node: int
    world_size: int               # training processes (1 for single-device / CPU runs)
    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int
    micro_batch_size: int
    gradient_accumulation: int
    global_batch_size: int        # micro_batch_size * gradient_accumulation * data_parallel
    gradient_checkpointing: bool
    zero_stage: int | None
    offload: str                  # "none" | "optimizer" | "optimizer+params"
    memory_gb: dict[str, float] = field(default_factory=dict)   # per-GPU estimate by component
    reasons: dict[str, Choice] = field(default_factory=dict)    # per decision
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready representation (written to plan.json)."""
        return asdict(self)
