"""DeepSpeed ZeRO-0/1/2/3 (with CPU optimizer / parameter offload) under the transformers/TRL trainers.

The DeepSpeed config comes from the plan (`backends.artifacts.deepspeed_config`): explicit batch sizes
(micro x accumulation x world), the ZeRO stage, offload, precision. It is written to the run directory
as deepspeed.json for the launcher and humans; each worker builds the same dict from the same plan.

The backend is composed of two parts, one job each:

* `deepspeed_plan`: ZeRO presets, the layouts it offers the planner, its memory terms and its part
  of the plan (`ZeroPart`);
* `deepspeed_run`: deepspeed.json and the accelerate section, each worker's set-up (Accelerate's
  state made for DeepSpeed first, described there), the Trainer arguments, the final save and the
  report of what ran.
"""

from __future__ import annotations

from recipeforge.backends.deepspeed_plan import NAME, PRESETS, ZeroPart, ZeroPlanner, preset_name, zero_part
from recipeforge.backends.deepspeed_run import DeepSpeedRuntime
from recipeforge.capabilities import OFFLOAD_MODES, BackendCapabilities

__all__ = ["NAME", "PRESETS", "DeepSpeedBackend", "ZeroPart", "preset_name", "zero_part"]


class DeepSpeedBackend(ZeroPlanner, DeepSpeedRuntime):
    """ZeRO data parallelism through DeepSpeed's engine."""

    name = NAME
    capabilities = BackendCapabilities(
        NAME, "ZeRO data parallelism; gloo on the CPU",
        offload=OFFLOAD_MODES, zero_stages=(0, 1, 2, 3),
        offload_zero_stages={"optimizer": (2, 3), "optimizer+params": (3,)},
        qlora_zero_stages=(0, 1, 2), offload_optimizers=("adamw", "adamw_fused"),
        presets=tuple(p.name for p in PRESETS), package="deepspeed", extra="deepspeed",
        why={"qlora_zero": "ZeRO-3 partitions 4-bit QLoRA weights (stored as bf16/fp16 words, "
                           "bnb_4bit_quant_storage) but not 8-bit ones, which are int8 with per-row scales",
             "offload_zero": "ZeRO offloads optimizer states from stage 2 and parameters from stage 3",
             "offload_optimizer": "DeepSpeed steps offloaded optimizer states with its own CPU Adam"})
