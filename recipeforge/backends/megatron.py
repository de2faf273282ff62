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

What the backend does with each recipe field is in `config.schema.megatron_fields` (validation refuses the rest there, and `check` again).
Megatron-Bridge and Transformer Engine are imported inside functions only. Megatron-Core's forward
needs CUDA, so this backend runs on GPUs only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.backends.base import BackendSpec, Log
from recipeforge.capabilities import BackendCapabilities, Preset
from recipeforge.stage_specs import Stage
from recipeforge.errors import Problem, RecipeError
from recipeforge.plan.backend_spec import Candidate
from recipeforge.backends.megatron_plan import megatron_states, parallel_sizes
from recipeforge.plan.memory import Layout
from recipeforge.plan.types import Choice, Plan

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, ProcessorMixin, Trainer

    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.config.schema import DistributedConfig, Recipe
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.workload import Workload
    from recipeforge.stages.context import StageContext

NAME = "megatron"
# Presets are generated for each tensor x pipeline split: tp{T}_pp{P}[_offload].
PRESET_PATTERN = re.compile(r"^tp(\d+)_pp(\d+)(_offload)?$")


def megatron_installed() -> bool:
    """Whether Megatron-Bridge is installed (looked up, not imported)."""
    from recipeforge.plan.policy import backend_installed

    return backend_installed(MegatronBackend.capabilities)


class MegatronBackend(BackendSpec):
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
    exports_after_job = True  # final/ (and a LoRA merge) are written by `finish_launch`
    trainer_holds_weights = False
    torch_allocates_gradients = False
    sequence_parallel = True
    preset_names_sizes = True
    # Megatron-Bridge trains packed rows one per micro batch (`components.megatron_data`); a pinned
    # micro batch other than 1 is refused with the recipe (`config.schema.megatron_fields`).
    fixed_micro_batch = 1

    # -- planning ---------------------------------------------------------------------------------
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

    def runner(self, stage: str) -> str | None:
        return "recipeforge.stages.megatron_lm:MegatronLMStage" if stage in self.capabilities.stages else None

    # -- running ----------------------------------------------------------------------------------
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
