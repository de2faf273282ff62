"""Megatron-Bridge: tensor / pipeline / data parallel pretraining and SFT (full or LoRA) of Hugging Face models.

The pieces, and where each runs:

* before the job, in the launching process: `prepare_launch` converts the Hugging Face checkpoint to
  Megatron's format once (`megatron_convert.import_checkpoint`, cached);
* in every torchrun worker, on the usual stage protocol: the Megatron stage runner
  (`stages.megatron_lm`) writes the shared data step's token rows in Megatron's formats
  (`components.megatron_data`), builds the `ConfigContainer` with `build_config` (handed to it by
  `trainer_kwargs`) from `megatron_config` (a pure translation of recipe + plan) and runs
  Megatron-Bridge's `finetune` loop. Every rank takes the same path;
* after the job, in the launching process: `finish_launch` exports the last checkpoint to final/
  (`megatron_convert.export_final`) and merges a LoRA adapter when the recipe asks.

The backend class here composes two parts, one job each: `megatron_plan` (presets, layouts, memory
terms, reasons and refusals: what the planner reads) and `megatron_run` (launcher, files, the job's
before and after, the worker's stage runner and configuration); it keeps its capability record and
`check`, which refuses a plan it cannot run.

What the backend does with each recipe field is in `config.schema.megatron_fields` (validation refuses the rest there, and `check` again).
Megatron-Bridge and Transformer Engine are imported inside functions only. Megatron-Core's forward
needs CUDA, so this backend runs on GPUs only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.backends.megatron_plan import NAME, PRESET_PATTERN, MegatronPlanner
from recipeforge.backends.megatron_run import MegatronRuntime
from recipeforge.capabilities import BackendCapabilities
from recipeforge.errors import Problem, RecipeError
from recipeforge.stage_specs import Stage

if TYPE_CHECKING:
    from recipeforge.config.schema import Recipe
    from recipeforge.plan.types import Plan

__all__ = ["NAME", "PRESET_PATTERN", "MegatronBackend", "megatron_installed"]


def megatron_installed() -> bool:
    """Whether Megatron-Bridge is installed (looked up, not imported)."""
    from recipeforge.plan.policy import backend_installed

    return backend_installed(MegatronBackend.capabilities)


class MegatronBackend(MegatronPlanner, MegatronRuntime):
    """Megatron-Core parallelism through Megatron-Bridge's training loop (its own stage runner)."""

    name = NAME
    capabilities = BackendCapabilities(
        NAME, "Megatron-Core tensor / pipeline / data parallelism through Megatron-Bridge",
        stages=(Stage.PRETRAIN.value, Stage.SFT.value), devices=("cuda",), adapters=("none", "lora"),
        quantization_bits=(), offload=("none", "optimizer"), max_cpu_processes=0,
        parallel_sizes=("tensor_parallel", "pipeline_parallel"),
        offload_optimizers=("adamw", "adamw_fused"), presets=("tp{T}_pp{P}", "tp{T}_pp{P}_offload"),
        package="megatron.bridge", distribution="megatron-bridge", extra="megatron",
        why={"stages": "Megatron-Bridge's training loop has no preference or RL losses and loads no "
                       "distillation teacher",
             "devices": "Megatron-Core's forward is CUDA-only", "adapters": "Megatron-Bridge's LoRA has no 4-bit base",
             "offload": "the distributed optimizer offloads optimizer states only (optimizer_cpu_offload)",
             "offload_optimizer": "Megatron-Core offloads Adam's states to the CPU, not SGD's"})

    # -- before launch: what it refuses -------------------------------------------------------------
    def check(self, plan: Plan, recipe: Recipe) -> None:
        from recipeforge.backends.megatron_bridge import EXTRA_HINT
        from recipeforge.config.schema.megatron_fields import megatron_problems

        if plan.backend != self.name:
            raise RecipeError(f"the plan uses backend {plan.backend}, not megatron", key="distributed.backend")
        # stages, CUDA only, adapters, offload: the capability record (recipeforge.capabilities)
        self.check_supported(plan, recipe)
        problems = megatron_problems(recipe)
        if problems:
            raise RecipeError([Problem(message, key=key) for key, message in problems])
        if not megatron_installed():
            raise RecipeError("the megatron backend needs Megatron-Bridge and Transformer Engine, which are "
                              "not installed", key="distributed.backend", hint=EXTRA_HINT)
