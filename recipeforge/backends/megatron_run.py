"""Megatron's running part: the launcher and its files, the work around the job in the launching
process (the checkpoint converted before it, final/ exported and a LoRA merged after it), and what each
torchrun worker asks of the backend (the stage runner and its configuration builder).
`megatron.MegatronBackend` composes it with the planning part (`megatron_plan`).

Megatron-Bridge and Transformer Engine are imported inside the modules these methods call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.backends.base import BackendSpec, Log
from recipeforge.plan.types import Plan

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, ProcessorMixin, Trainer

    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.config.schema import Recipe
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.stages.context import StageContext


class MegatronRuntime(BackendSpec):
    """What the launcher and each worker ask of Megatron: torchrun, its files, the job's before and after,
    the stage runner and its configuration."""

    exports_after_job = True  # final/ (and a LoRA merge) are written by `finish_launch`

    # -- the stage runner (inside each worker) ----------------------------------------------------
    def runner(self, stage: str) -> str | None:
        return "recipeforge.stages.megatron_lm:MegatronLMStage" if stage in self.capabilities.stages else None

    # -- launching ----------------------------------------------------------------------------------
    def launcher(self, plan: Plan) -> str:
        return "torchrun"  # Megatron initialises its own process groups from torchrun's environment

    def launch_env(self, plan: Plan) -> dict[str, str]:
        # Megatron-Core overlaps TP communication with compute only with one CUDA connection.
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}

    def launch_files(self, plan: Plan, recipe: Recipe) -> dict[str, str]:
        from recipeforge.backends.artifacts import megatron_parallel_settings

        return {"megatron_parallel.json": json.dumps(megatron_parallel_settings(plan, recipe), indent=2) + "\n"}

    # -- around the job (launching process, one process) ---------------------------------------
    def prepare_launch(self, loaded: LoadedRecipe, plan: Plan, run: RunDir, *, log: Log = print) -> Path:
        """Convert the Hugging Face model before any worker starts; returns the converted entry."""
        from recipeforge.backends.megatron_convert import import_checkpoint

        return import_checkpoint(loaded.recipe, run_root=run.root, log=log)

    def finish_launch(self, loaded: LoadedRecipe, plan: Plan, run: RunDir, *, log: Log = print) -> Path:
        """final/ from the job's last checkpoint, then the LoRA merge when `output.merge_adapter`."""
        from recipeforge.backends.megatron_convert import export_final

        final = export_final(loaded.recipe, run, log=log)
        recipe = loaded.recipe
        if recipe.output.merge_adapter and recipe.adapter.type != "none":
            from recipeforge.outputs.merge import merge_adapter

            merge_adapter(run.root)
        return final

    # -- inside each worker ---------------------------------------------------------------------
    def trainer_kwargs(self, ctx: StageContext) -> dict[str, Any]:
        """The Megatron stage's configuration builder (the stage never imports a backend)."""
        from functools import partial

        from recipeforge.backends.megatron_container import build_config

        return {"build_config": partial(build_config, ctx)}

    def save_final(self, ctx: StageContext, trainer: Trainer, model: torch.nn.Module,
                   tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path | None:
        return None  # final/ is exported after the job (`finish_launch`)

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]:
        return {}
