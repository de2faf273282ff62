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

import importlib
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.backends.base import BackendSpec, Log
from recipeforge.capabilities import BackendCapabilities, Preset
from recipeforge.stage_specs import Stage
from recipeforge.errors import Problem, RecipeError
from recipeforge.plan.backend_spec import Candidate
from recipeforge.plan.estimators import zero_model_states
from recipeforge.plan.memory import Layout, assign_trainable, optimizer_state_bytes
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

# ConfigContainer field -> Megatron-Bridge 0.6 class (module, name). Built with keyword arguments, so a
# field the installed version does not have fails at construction instead of being dropped.
SECTIONS = {
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "validation": ("megatron.bridge.training.config", "ValidationConfig"),
    "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
    "scheduler": ("megatron.bridge.training.config", "SchedulerConfig"),
    "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
    "checkpoint": ("megatron.bridge.training.config", "CheckpointConfig"),
    "logger": ("megatron.bridge.training.config", "LoggerConfig"),
    "tokenizer": ("megatron.bridge.training.config", "TokenizerConfig"),
    "rng": ("megatron.bridge.training.config", "RNGConfig"),
    "dist": ("megatron.bridge.training.config", "DistributedInitConfig"),
    "rerun_state_machine": ("megatron.bridge.training.config", "RerunStateMachineConfig"),
    "peft": ("megatron.bridge.peft.lora", "LoRA"),
}
DATASETS = {"sft": ("megatron.bridge.data.builders", "GPTSFTDatasetConfig")}
PACKING = ("megatron.bridge.data.packing", "PackedSequenceSpecs")
DTYPES = ("params_dtype", "pipeline_dtype")  # written as names in the pure translation


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

        return {"build_config": partial(build_config, ctx)}

    def save_final(self, ctx: StageContext, trainer: Trainer, model: torch.nn.Module,
                   tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path | None:
        return None  # final/ is exported after the job (`finish_launch`)

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]:
        return {}


def converted_base(recipe: Recipe, run_root: Path) -> Path:
    """The converted checkpoint `prepare_launch` left (same cache key); an error when it is missing."""
    from recipeforge.backends.megatron_convert import _cache_root, base_checkpoint, cache_key
    from recipeforge.backends.megatron_weights import layer_spec_name
    from recipeforge.components.tiny_spec import tiny_arch

    m = recipe.model
    entry = run_root / "megatron_base" if tiny_arch(m.name_or_path) else \
        _cache_root() / cache_key(m.name_or_path, m.revision, m.trust_remote_code, layer_spec_name())
    if not (entry / "done.json").is_file():
        raise RecipeError(f"no converted Megatron checkpoint of {m.name_or_path} at {entry}",
                          key="model.name_or_path",
                          hint="start the run with `recipeforge train` (it converts before launching) or run "
                               "`recipeforge convert-checkpoint RECIPE` first; on several nodes, "
                               "$RECIPEFORGE_CACHE must be on a shared filesystem")
    return base_checkpoint(entry)


def build_config(ctx: StageContext, *, data: dict[str, Any], train_iters: int) -> Any:
    """The Megatron-Bridge `ConfigContainer` for this worker (called by the Megatron stage runner)."""
    from recipeforge.backends.megatron_config import megatron_config

    recipe = ctx.recipe
    settings = megatron_config(ctx.plan, recipe, run_dir=ctx.run.root, data=data, train_iters=train_iters,
                               base_checkpoint=converted_base(recipe, ctx.run.root))
    return build_container(settings, recipe, hf_path=_hf_path(recipe, ctx.run.root))


def _hf_path(recipe: Recipe, run_root: Path) -> str:
    from recipeforge.components.tiny_spec import tiny_arch

    return str(run_root / "base_model") if tiny_arch(recipe.model.name_or_path) else recipe.model.name_or_path


def construct(section: str, klass: Callable[..., Any], values: dict[str, Any]) -> Any:
    """`klass(**values)`: a field the installed Megatron-Bridge lacks is an error naming it."""
    import torch

    values = {k: getattr(torch, v) if k in DTYPES and isinstance(v, str) else v for k, v in values.items()}
    try:
        return klass(**values)
    except TypeError as exc:
        raise RecipeError(f"the installed Megatron-Bridge does not take {section} settings {sorted(values)}: {exc}",
                          key="distributed.backend",
                          hint="install the version the `megatron` extra pins: pip install 'recipeforge[megatron]'") \
            from None


def _class(spec: tuple[str, str]) -> Any:
    module, name = spec
    return getattr(importlib.import_module(module), name)


def build_container(settings: dict[str, Any], recipe: Recipe, *, hf_path: str) -> Any:
    """The `ConfigContainer` from `megatron_config`'s sections, every dataclass built with keywords."""
    from recipeforge.backends.megatron_bridge import auto_bridge

    from megatron.bridge.training.config import ConfigContainer

    m = recipe.model
    provider = auto_bridge().from_hf_pretrained(hf_path, trust_remote_code=m.trust_remote_code) \
        .to_megatron_provider(load_weights=False)
    for key, value in settings["model"].items():  # the provider exists already: set, but only known fields
        if not hasattr(provider, key):
            raise RecipeError(f"the installed Megatron-Bridge's model provider has no field {key}",
                              key="distributed.backend", hint="pip install 'recipeforge[megatron]'")
        import torch

        setattr(provider, key, getattr(torch, value) if key in DTYPES and isinstance(value, str) else value)
    sections = {name: construct(name, _class(spec), settings[name])
                for name, spec in SECTIONS.items() if settings.get(name) is not None}
    dataset = dict(settings["dataset"])
    kind = dataset.pop("kind")
    specs = dataset.pop("offline_packing_specs", None)
    if specs is not None:
        dataset["offline_packing_specs"] = construct("offline_packing_specs", _class(PACKING), specs)
    sections["dataset"] = construct("dataset", _class(DATASETS[kind]), dataset)
    return ConfigContainer(model=provider, mixed_precision=settings.get("mixed_precision"), **sections)


# ----------------------------------------------------------------------------- planning helpers

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
